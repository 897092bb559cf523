"""Check an unpacked wheel tree against its RECORD (and RECORD against the published
wheel's), then zip it back (stored) so the harness can pip-install it.  The zip's bytes
differ from the published wheel's; every file in it is the published file."""
import base64, csv, hashlib, sys, zipfile
from pathlib import Path

tree, record_sha, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
record = next(tree.glob("*.dist-info/RECORD"))
assert hashlib.sha256(record.read_bytes()).hexdigest() == record_sha, "RECORD differs"
n = 0
for path, digest, _ in csv.reader(record.read_text().splitlines()):
    if not digest:
        continue
    algo, want = digest.split("=", 1)
    got = base64.urlsafe_b64encode(hashlib.new(algo, (tree / path).read_bytes()).digest())
    assert got.rstrip(b"=").decode() == want.rstrip("="), path
    n += 1
files = sorted(p for p in tree.rglob("*") if p.is_file())
assert len(files) == n + 1, (len(files), n)  # every file listed, RECORD itself unhashed
out.parent.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
    for p in files:
        zf.write(p, p.relative_to(tree).as_posix())
print(f"tree matches RECORD: {n} files hashed; RECORD sha256 {record_sha}; rezipped {out.name}")
