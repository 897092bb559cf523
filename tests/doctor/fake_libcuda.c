// Host-memory stand-in for the libcuda calls doctor/cuda.py makes (CPU test of the ctypes glue:
// argument packing, the IPC handle by value, the VMM structs' layout, kernel parameters).
// "Device memory" is shared memory in /dev/shm; a VMM allocation is a file whose descriptor is
// the exported handle. FAKE_DROP=1 drops the copy kernel's stores into imported (peer) memory.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
typedef int CUresult;
#define FAKE_MAP getenv("FAKE_CUDA_MAP")
typedef struct { char reserved[64]; } H;
typedef struct { int type; int id; } Loc;
typedef struct { int type; int handleTypes; Loc location; void *win32; unsigned char compression;
  unsigned char rdma; unsigned short usage; unsigned char reserved[4]; } Prop;
typedef struct { Loc location; int flags; } Access;
static int counter;
static uint64_t peer_lo[64], peer_hi[64]; static int npeer;
static int vmm_fd[64]; static size_t vmm_size[64]; static int nvmm;
CUresult cuInit(unsigned f){return 0;}
CUresult cuGetErrorName(CUresult r, const char **s){*s="CUDA_ERROR_FAKE";return 0;}
CUresult cuDriverGetVersion(int *v){*v=13000;return 0;}
CUresult cuDeviceGetCount(int *n){*n=2;return 0;}
CUresult cuDeviceGet(int *d,int i){*d=i;return 0;}
CUresult cuDeviceGetName(char *b,int len,int d){snprintf(b,len,"Fake GPU %d",d);return 0;}
CUresult cuDeviceGetPCIBusId(char *b,int len,int d){snprintf(b,len,"0000:%02X:00.0",0x3B+d);return 0;}
CUresult cuDeviceGetAttribute(int *v,int a,int d){if(a==75)*v=12;else if(a==76)*v=0;else if(a==132)*v=0;else if(a==16)*v=2;else return 1;return 0;}
CUresult cuDeviceCanAccessPeer(int *v,int a,int b){*v=1;return 0;}
CUresult cuDevicePrimaryCtxRetain(void **c,int d){*c=(void*)(intptr_t)(d+1);return 0;}
CUresult cuCtxSetCurrent(void *c){return 0;}
CUresult cuCtxSynchronize(void){return 0;}
static void *shm(size_t n,char *name){snprintf(name,64,"/dev/shm/sm120fork-fakecuda-%d-%d",getpid(),counter++);
 int fd=open(name,O_RDWR|O_CREAT,0600);ftruncate(fd,n);void*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);close(fd);
 FILE*f=fopen(FAKE_MAP,"a");fprintf(f,"%lu %s %zu\n",(unsigned long)(uintptr_t)m,name,n);fclose(f);return m;}
CUresult cuMemAlloc_v2(uint64_t *p,size_t n){char name[64];*p=(uint64_t)(uintptr_t)shm(n,name);return 0;}
CUresult cuMemsetD32_v2(uint64_t p,unsigned v,size_t n){uint32_t*q=(uint32_t*)(uintptr_t)p;for(size_t i=0;i<n;i++)q[i]=v;return 0;}
CUresult cuIpcGetMemHandle(H *h,uint64_t p){char line[1024];unsigned long a;char name[128];size_t n;FILE*f=fopen(FAKE_MAP,"r");
 while(fgets(line,256,f)){sscanf(line,"%lu %127s %zu",&a,name,&n);if(a==p){memset(h,0,64);snprintf(h->reserved,64,"%s:%zu",name,n);h->reserved[63]=7;fclose(f);return 0;}}fclose(f);return 2;}
CUresult cuIpcOpenMemHandle_v2(uint64_t *p,H h,unsigned flags){if(flags!=1||h.reserved[63]!=7)return 3;char name[64];size_t n;char*c=strchr(h.reserved,':');
 memcpy(name,h.reserved,c-h.reserved);name[c-h.reserved]=0;n=strtoul(c+1,0,10);int fd=open(name,O_RDWR);if(fd<0)return 4;
 void*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);close(fd);*p=(uint64_t)(uintptr_t)m;peer_lo[npeer]=*p;peer_hi[npeer++]=*p+n;return 0;}
static int prop_ok(const Prop *p){return sizeof(Prop)==32&&p->type==1&&p->handleTypes==1&&p->location.type==1&&p->rdma==1;}
CUresult cuMemGetAllocationGranularity(size_t *g,const Prop *p,int option){if(!prop_ok(p)||option!=1)return 8;*g=4096;return 0;}
CUresult cuMemCreate(unsigned long long *h,size_t n,const Prop *p,unsigned long long fl){if(!prop_ok(p)||n%4096)return 9;char name[64];
 snprintf(name,64,"/dev/shm/sm120fork-fakevmm-%d-%d",getpid(),counter++);int fd=open(name,O_RDWR|O_CREAT,0600);ftruncate(fd,n);
 FILE*f=fopen(FAKE_MAP,"a");fprintf(f,"0 %s %zu\n",name,n);fclose(f);vmm_fd[nvmm]=fd;vmm_size[nvmm]=n;*h=100+nvmm++;return 0;}
CUresult cuMemExportToShareableHandle(void *out,unsigned long long h,int type,unsigned long long fl){if(type!=1||h<100)return 10;*(int*)out=dup(vmm_fd[h-100]);return 0;}
CUresult cuMemImportFromShareableHandle(unsigned long long *h,void *os,int type){if(type!=1)return 11;int fd=(int)(intptr_t)os;
 vmm_fd[nvmm]=dup(fd);vmm_size[nvmm]=lseek(fd,0,SEEK_END);*h=100+nvmm;vmm_size[nvmm+32]=1;nvmm++;return 0;}
CUresult cuMemAddressReserve(uint64_t *p,size_t n,size_t align,uint64_t addr,unsigned long long fl){
 void*m=mmap(0,n,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);*p=(uint64_t)(uintptr_t)m;return 0;}
CUresult cuMemMap(uint64_t p,size_t n,size_t off,unsigned long long h,unsigned long long fl){if(h<100||n>vmm_size[h-100])return 12;
 void*m=mmap((void*)(uintptr_t)p,n,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED,vmm_fd[h-100],0);if(m==MAP_FAILED)return 13;
 if(vmm_size[h-100+32]){peer_lo[npeer]=p;peer_hi[npeer++]=p+n;}return 0;}
CUresult cuMemSetAccess(uint64_t p,size_t n,const Access *d,size_t count){if(sizeof(Access)!=12||count!=1||d->location.type!=1||d->flags!=3)return 14;return 0;}
CUresult cuModuleLoadData(void **m,const void *img){if(!strstr((const char*)img,".entry sm120fork_copy"))return 5;*m=(void*)1;return 0;}
CUresult cuModuleGetFunction(void **f,void *m,const char *name){if(strcmp(name,"sm120fork_copy"))return 6;*f=(void*)2;return 0;}
CUresult cuLaunchKernel(void *f,unsigned gx,unsigned gy,unsigned gz,unsigned bx,unsigned by,unsigned bz,unsigned sh,void *st,void **params,void **extra){
 uint64_t dst=*(uint64_t*)params[0],src=*(uint64_t*)params[1];uint32_t n=*(uint32_t*)params[2];
 if(getenv("FAKE_DROP"))for(int i=0;i<npeer;i++)if(dst>=peer_lo[i]&&dst<peer_hi[i])return 0;
 memcpy((void*)(uintptr_t)dst,(void*)(uintptr_t)src,(size_t)n*16);return 0;}
CUresult cuMemcpyDtoH_v2(void *h,uint64_t p,size_t n){memcpy(h,(void*)(uintptr_t)p,n);return 0;}
CUresult cuMemcpyHtoD_v2(uint64_t p,const void *h,size_t n){memcpy((void*)(uintptr_t)p,h,n);return 0;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static double stamps[64];static int nstamps;
CUresult cuEventCreate(void **e,unsigned fl){*e=(void*)(intptr_t)(++nstamps);return 0;}
CUresult cuEventRecord(void *e,void *s){stamps[(intptr_t)e]=now();return 0;}
CUresult cuEventSynchronize(void *e){return 0;}
CUresult cuEventElapsedTime(float *ms,void *a,void *b){*ms=(float)(stamps[(intptr_t)b]-stamps[(intptr_t)a])+0.001f;return 0;}
