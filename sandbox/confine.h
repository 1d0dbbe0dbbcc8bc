// Internal to sandbox/: the confinement steps bitroll-sandbox-helper applies to itself before it
// execs a tool: the seccomp denylist and the Landlock filesystem rules.
//
// These run in the helper (a fresh single-threaded process), never in the service.
#pragma once

#include <string>
#include <vector>

namespace bitroll::sandbox {

struct SeccompPolicy {
  // Refuse socket() for every family but AF_UNIX (EAFNOSUPPORT), and io_uring.
  bool deny_network_sockets = true;
};

// Loads the denylist into the calling process (with no_new_privs set). Denied with EPERM:
// ptrace, process_vm_{readv,writev}, mount/umount/pivot_root/move_mount/fsopen family, reboot,
// kexec, module loading, bpf, perf_event_open, swapon/off, acct, clock/time setting, keyctl
// family, unshare, setns, clone/clone3 with namespace flags (clone3: ENOSYS so libc falls back
// to clone), userfaultfd, open_by_handle_at, iopl/ioperm, syslog, quotactl, io_uring.
// Syscalls of other architectures (i386/x32 ABI) kill the process. Returns "" or an error.
std::string LoadSeccomp(const SeccompPolicy& policy);

// Writes the same filter as a BPF program to `fd` (for bwrap --seccomp FD). Returns "" or error.
std::string ExportSeccomp(const SeccompPolicy& policy, int fd);

struct LandlockPolicy {
  std::vector<std::string> read_only;   // read + execute beneath these (dirs or files)
  std::vector<std::string> read_write;  // full access beneath these (dirs or files)
  bool deny_tcp = true;                 // ABI >= 4: no TCP bind/connect
  bool scope_signals = true;            // ABI >= 6: no signals to processes outside the domain
  // ABI >= 6: no connect/send to abstract unix sockets made outside the domain (the host's,
  // reachable when the tool shares the host's network namespace).
  bool scope_abstract_unix = true;
  // false: handle no filesystem access (the lists must be empty) and no TCP, only the scopes:
  // for a process that must still mount (bwrap). Nothing to do below ABI 6.
  bool handle_fs = true;
};

// Restricts the calling process with Landlock. Paths that do not exist are skipped. Returns ""
// on success, "unsupported" when the kernel has no Landlock, or an error.
std::string ApplyLandlock(const LandlockPolicy& policy);

}  // namespace bitroll::sandbox
