# shellcheck shell=bash
# shellcheck disable=SC2034 # every setting here is used by the scripts that source this file
# Common settings for the rxe-vm scripts (sourced, not run).
# Everything big lives in the cache directory, never next to the scripts.
RXE_VM_CACHE=${RXE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpib-rxe-vm}
# Host packages (Debian 12). The kernel itself is only downloaded and unpacked
# into the cache (apt-get download + dpkg-deb -x), never installed on the host.
RXE_VM_HOST_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-utils
  ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils perftest iproute2
  cpio kmod xz-utils binutils)
# Kernel modules the guest loads (dependencies are resolved with modprobe).
# rdma_rxe needs the "crc32" crypto shash (ICRC) at `rdma link add` time.
RXE_VM_MODULES=(virtio_pci virtio_net veth 9pnet_virtio 9p crc32_generic crc32_pclmul
  ib_uverbs rdma_rxe rdma_ucm ib_umad sch_netem)
# Programs (and, through ldd, their libraries) copied into the initramfs.
RXE_VM_PROGS=(/usr/bin/ibv_* /usr/bin/rdma /usr/bin/ip /usr/sbin/tc /usr/sbin/rdma-ndd
  /usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/rdma_client
  /usr/bin/rdma_server /usr/bin/rdma_xclient /usr/bin/rdma_xserver
  /usr/bin/rstream /usr/bin/riostream /usr/bin/mckey /usr/bin/cmtime
  /usr/bin/rcopy /usr/bin/udpong
  /usr/bin/ib_write_bw /usr/bin/ib_write_lat /usr/bin/ib_read_bw
  /usr/bin/ib_read_lat /usr/bin/ib_send_bw /usr/bin/ib_send_lat
  /usr/bin/ib_atomic_bw /usr/bin/ib_atomic_lat)
# Extra libraries a host-built test program commonly needs (Rust: libgcc_s).
RXE_VM_EXTRA_LIBS=(libgcc_s.so.1 libstdc++.so.6 libm.so.6 libdl.so.2
  libpthread.so.0 librt.so.1 libibverbs.so.1 librdmacm.so.1 libibumad.so.3
  libnl-3.so.200 libnl-route-3.so.200 libz.so.1 libzstd.so.1 liblzma.so.5)
# libibverbs providers to ship (the .driver file and the provider .so).
RXE_VM_PROVIDERS=(rxe siw)

rxe_vm_log() { echo "[rxe-vm] $*" >&2; }
