// Host-memory stand-in for the libcuda calls doctor/cuda.py makes (CPU test of the ctypes glue).
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
typedef int CUresult;
#define FAKE_MAP getenv("FAKE_CUDA_MAP")
typedef struct { char reserved[64]; } H;
static int counter;
CUresult cuInit(unsigned f){return 0;}
CUresult cuGetErrorName(CUresult r, const char **s){*s="CUDA_ERROR_FAKE";return 0;}
CUresult cuDriverGetVersion(int *v){*v=13000;return 0;}
CUresult cuDeviceGetCount(int *n){*n=2;return 0;}
CUresult cuDeviceGet(int *d,int i){*d=i;return 0;}
CUresult cuDeviceGetName(char *b,int len,int d){snprintf(b,len,"Fake GPU %d",d);return 0;}
CUresult cuDeviceGetAttribute(int *v,int a,int d){if(a==75)*v=12;else if(a==76)*v=0;else if(a==132)*v=0;else return 1;return 0;}
CUresult cuDeviceCanAccessPeer(int *v,int a,int b){*v=1;return 0;}
CUresult cuDevicePrimaryCtxRetain(void **c,int d){*c=(void*)(intptr_t)(d+1);return 0;}
CUresult cuCtxSetCurrent(void *c){return 0;}
CUresult cuCtxSynchronize(void){return 0;}
CUresult cuMemAlloc_v2(uint64_t *p,size_t n){char name[64];snprintf(name,64,"/dev/shm/sm120fork-fakecuda-%d-%d",getpid(),counter++);
 int fd=open(name,O_RDWR|O_CREAT,0600);ftruncate(fd,n);void*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);close(fd);
 *p=(uint64_t)(uintptr_t)m; FILE*f=fopen(FAKE_MAP,"a");fprintf(f,"%lu %s %zu\n",(unsigned long)*p,name,n);fclose(f);return 0;}
CUresult cuMemsetD32_v2(uint64_t p,unsigned v,size_t n){uint32_t*q=(uint32_t*)(uintptr_t)p;for(size_t i=0;i<n;i++)q[i]=v;return 0;}
CUresult cuIpcGetMemHandle(H *h,uint64_t p){char line[1024];unsigned long a;char name[128];size_t n;FILE*f=fopen(FAKE_MAP,"r");
 while(fgets(line,256,f)){sscanf(line,"%lu %127s %zu",&a,name,&n);if(a==p){memset(h,0,64);snprintf(h->reserved,64,"%s:%zu",name,n);h->reserved[63]=7;fclose(f);return 0;}}fclose(f);return 2;}
CUresult cuIpcOpenMemHandle_v2(uint64_t *p,H h,unsigned flags){if(flags!=1||h.reserved[63]!=7)return 3;char name[64];size_t n;char*c=strchr(h.reserved,':');
 memcpy(name,h.reserved,c-h.reserved);name[c-h.reserved]=0;n=strtoul(c+1,0,10);int fd=open(name,O_RDWR);if(fd<0)return 4;
 void*m=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);close(fd);*p=(uint64_t)(uintptr_t)m;return 0;}
CUresult cuModuleLoadData(void **m,const void *img){if(!strstr((const char*)img,".entry sm120fork_peer_write"))return 5;*m=(void*)1;return 0;}
CUresult cuModuleGetFunction(void **f,void *m,const char *name){if(strcmp(name,"sm120fork_peer_write"))return 6;*f=(void*)2;return 0;}
CUresult cuLaunchKernel(void *f,unsigned gx,unsigned gy,unsigned gz,unsigned bx,unsigned by,unsigned bz,unsigned sh,void *st,void **params,void **extra){
 uint32_t *dst=(uint32_t*)(uintptr_t)*(uint64_t*)params[0];uint32_t n=*(uint32_t*)params[1],seed=*(uint32_t*)params[2];
 if((uint64_t)gx*bx<n)return 7; if(getenv("FAKE_DROP"))return 0; for(uint32_t i=0;i<n;i++)dst[i]=i^seed;return 0;}
CUresult cuMemcpyDtoH_v2(void *h,uint64_t p,size_t n){memcpy(h,(void*)(uintptr_t)p,n);return 0;}
