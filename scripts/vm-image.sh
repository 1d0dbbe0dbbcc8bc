#!/usr/bin/env bash
# Builds the sandbox VM tier's image into CACHE_DIR: a Debian kernel (vmlinuz, and vmlinux: the
# same kernel uncompressed, which QEMU boots through its PVH entry point without the slow
# self-decompression under TCG) and a busybox initramfs (initramfs.cpio.gz) whose /init runs one
# task and powers off.
#
#   scripts/vm-image.sh CACHE_DIR
#
# Idempotent: a cache that already holds both files and the matching init version is left alone.
# Needs: apt-get (download only, no install), dpkg, busybox-static, cpio, gzip, /usr/bin/python3
# (its lzma/gzip modules unpack vmlinux; without it only vmlinuz is written, which boots slower).
#
# The task protocol (sandbox/vm_runner.cc writes the task side; keep the two in step):
#   The host appends a second, uncompressed newc cpio archive to the initramfs with
#     /task/run.sh   the command, shell-quoted (`exec 'argv0' 'argv1' ...`)
#     /task/limits   shell assignments: WALL (s), CPU (s), MEMKB, NPROC, OUTB (bytes per stream),
#                    FILEB (bytes per output file)
#     /task/stdin    bytes for the command's stdin
#     /task/files/   files placed in the workdir (/work, a tmpfs)
#     /task/outputs  names of files to send back, one per line
#   /init runs the command as uid/gid 65534 in /work with those limits and prints on the serial
#   console, between @@BITROLL-BEGIN@@ and @@BITROLL-END@@, lines
#     rc N | timedout 0/1 | stdout N + base64 lines + @@ | stderr N + ... | file NAME N + ... + @@
#   then reboots (the host runs qemu with -no-reboot, so a reboot ends qemu).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 CACHE_DIR" >&2
  exit 2
fi
cache="$1"
INIT_VERSION=6
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

if [ -f "$cache/vmlinuz" ] && [ -f "$cache/vmlinux" ] && [ -f "$cache/initramfs.cpio.gz" ] &&
  [ "$(cat "$cache/init-version" 2>/dev/null)" = "$INIT_VERSION" ]; then
  echo "vm-image: $cache is up to date (vmlinuz, initramfs.cpio.gz, init v$INIT_VERSION)"
  exit 0
fi

for tool in apt-get apt-cache dpkg cpio gzip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "vm-image: missing tool: $tool" >&2; exit 1; }
done
busybox="$(command -v busybox || true)"
if [ -z "$busybox" ] || ! (ldd "$busybox" 2>&1 || true) | grep -q 'not a dynamic executable'; then
  echo "vm-image: $busybox is not static; install busybox-static" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Kernel: resolve the linux-image-amd64 metapackage to the current versioned package.
if [ ! -f "$cache/vmlinuz" ]; then
  pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  if [ -z "$pkg" ]; then
    echo "vm-image: cannot resolve linux-image-amd64 (run apt-get update?)" >&2
    exit 1
  fi
  echo "vm-image: downloading $pkg with apt-get download"
  (cd "$work" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  deb="$(ls "$work"/"$pkg"_*.deb 2>/dev/null | head -1)"
  [ -n "$deb" ] || { echo "vm-image: apt-get download $pkg failed" >&2; exit 1; }
  echo "vm-image: unpacking $(basename "$deb") with dpkg -x"
  dpkg -x "$deb" "$work/kernel"
  vmlinuz="$(ls "$work"/kernel/boot/vmlinuz-* | head -1)"
  cp "$vmlinuz" "$cache/vmlinuz.tmp"
  mv "$cache/vmlinuz.tmp" "$cache/vmlinuz"
  echo "$pkg" >"$cache/kernel-package"
fi

# 1b. vmlinux: the payload of the bzImage, found by its compression magic.
if [ ! -f "$cache/vmlinux" ] && [ -x /usr/bin/python3 ]; then
  echo "vm-image: unpacking vmlinux from vmlinuz (PVH boot)"
  /usr/bin/python3 - "$cache/vmlinuz" "$cache/vmlinux.tmp" <<'PY'
import gzip, lzma, sys, zlib
data = open(sys.argv[1], "rb").read()
for magic, unpack in ((b"\xfd7zXZ\x00", lambda b: lzma.LZMADecompressor().decompress(b)),
                      (b"\x1f\x8b\x08", lambda b: zlib.decompressobj(31).decompress(b))):
    at = data.find(magic)
    while at >= 0:
        try:
            out = unpack(data[at:])
        except Exception:
            out = b""
        if out[:4] == b"\x7fELF":
            open(sys.argv[2], "wb").write(out)
            sys.exit(0)
        at = data.find(magic, at + 1)
sys.exit("vm-image: no ELF payload found in vmlinuz")
PY
  mv "$cache/vmlinux.tmp" "$cache/vmlinux"
fi

# 2. Initramfs: static busybox + /init. Debian's kernel has virtio-mmio, serial 8250 and tmpfs
# built in, so no modules are needed for a console-only guest.
echo "vm-image: building initramfs from $busybox"
root="$work/initramfs"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,work,task,etc}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
cat >"$root/init" <<'EOF'
#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /tmp
# The harness keeps its own files where the tool (uid 65534) cannot touch them.
mkdir -m 700 /b
WALL=10; CPU=10; MEMKB=unlimited; NPROC=64; OUTB=1048576; FILEB=1048576
[ -f /task/limits ] && . /task/limits
mount -t tmpfs -o mode=0755,size=64m tmpfs /work
[ -d /task/files ] && cp -a /task/files/. /work/ 2>/dev/null
chown -R 65534:65534 /work
[ -f /task/stdin ] || : >/task/stdin
mkfifo /b/o /b/e
head -c $((OUTB + 1)) </b/o >/b/out &
head -c $((OUTB + 1)) </b/e >/b/err &
cd /work
(
  ulimit -t "$CPU"; ulimit -v "$MEMKB"; ulimit -u "$NPROC"
  exec su -s /bin/sh nobody -c "sh /task/run.sh"
) </task/stdin >/b/o 2>/b/e &
pid=$!
( sleep "$WALL"; : >/b/timedout; kill -9 -1 ) 2>/dev/null &
wd=$!
wait $pid
rc=$?
kill -9 $wd 2>/dev/null
sleep 0.05
kill -9 -1 2>/dev/null
wait 2>/dev/null
emit() { # NAME FILE
  n=$(wc -c <"$2")
  echo "$1 $n"
  base64 "$2"
  echo "@@"
}
echo "@@BITROLL-BEGIN@@"
echo "rc $rc"
if [ -f /b/timedout ]; then echo "timedout 1"; else echo "timedout 0"; fi
emit stdout /b/out
emit stderr /b/err
if [ -f /task/outputs ]; then
  while read -r name; do
    [ -n "$name" ] || continue
    if [ -f "/work/$name" ] && [ ! -L "/work/$name" ]; then
      head -c $((FILEB + 1)) "/work/$name" >/b/f
      emit "file $name" /b/f
    fi
  done </task/outputs
fi
echo "@@BITROLL-END@@"
sync
reboot -f
EOF
chmod 755 "$root/init"
(cd "$root" && find . | sort | cpio -o -H newc --quiet | gzip -9) >"$cache/initramfs.cpio.gz.tmp"
mv "$cache/initramfs.cpio.gz.tmp" "$cache/initramfs.cpio.gz"
echo "$INIT_VERSION" >"$cache/init-version"
echo "vm-image: wrote $cache/{vmlinuz,vmlinux,initramfs.cpio.gz}"
