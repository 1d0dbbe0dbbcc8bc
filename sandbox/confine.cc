#include "sandbox/confine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace bitroll::sandbox {
namespace {

// Syscalls no tool needs and an attacker wants. Names unknown to libseccomp are skipped.
constexpr const char* kDenied[] = {
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "reboot",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "vhangup",
    "personality",
    "chroot",
    "fanotify_init",
    "sethostname",
    "setdomainname",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "uselib",
    "nfsservctl",
};

constexpr uint64_t kNamespaceFlags[] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWNET,   CLONE_NEWPID,
                                        CLONE_NEWIPC,  CLONE_NEWUTS, CLONE_NEWCGROUP};

std::string Build(const SeccompPolicy& policy, scmp_filter_ctx* out) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return "seccomp_init failed";
  // Other ABIs (i386 via int 0x80, x32) are not added, so the default bad-arch action (kill)
  // applies to them.
  int rc = 0;
  for (const char* name : kDenied) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR || nr < 0) continue;
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (rc != 0) break;
  }
  // clone3 passes flags in memory, which seccomp cannot inspect: make libc fall back to clone.
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  for (uint64_t flag : kNamespaceFlags) {
    if (rc != 0) break;
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
  }
  if (rc == 0 && policy.deny_network_sockets) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                          SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  }
  if (rc != 0) {
    seccomp_release(ctx);
    return std::string("seccomp_rule_add: ") + std::strerror(-rc);
  }
  *out = ctx;
  return "";
}

// Landlock constants newer than Debian 12's linux/landlock.h.
constexpr uint64_t kFsTruncate = 1ull << 14;  // ABI 3
constexpr uint64_t kFsIoctlDev = 1ull << 15;  // ABI 5
constexpr uint64_t kNetBindTcp = 1ull << 0;   // ABI 4
constexpr uint64_t kNetConnectTcp = 1ull << 1;
constexpr uint64_t kScopeAbstractUnix = 1ull << 0;  // ABI 6
constexpr uint64_t kScopeSignal = 1ull << 1;

struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};

constexpr uint64_t kFileRights = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                                 LANDLOCK_ACCESS_FS_READ_FILE | kFsTruncate | kFsIoctlDev;

}  // namespace

std::string LoadSeccomp(const SeccompPolicy& policy) {
  scmp_filter_ctx ctx = nullptr;
  std::string err = Build(policy, &ctx);
  if (!err.empty()) return err;
  int rc = seccomp_load(ctx);  // sets no_new_privs (SCMP_FLTATR_CTL_NNP defaults on)
  seccomp_release(ctx);
  if (rc != 0) return std::string("seccomp_load: ") + std::strerror(-rc);
  return "";
}

std::string ExportSeccomp(const SeccompPolicy& policy, int fd) {
  scmp_filter_ctx ctx = nullptr;
  std::string err = Build(policy, &ctx);
  if (!err.empty()) return err;
  int rc = seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  if (rc != 0) return std::string("seccomp_export_bpf: ") + std::strerror(-rc);
  if (lseek(fd, 0, SEEK_SET) != 0) return std::string("lseek: ") + std::strerror(errno);
  return "";
}

std::string ApplyLandlock(const LandlockPolicy& policy) {
  long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return "unsupported";
  if (!policy.handle_fs && abi < 6) return "";           // no scopes to apply
  uint64_t fs = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: bits 0..12
  if (abi >= 2) fs |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) fs |= kFsTruncate;
  if (abi >= 5) fs |= kFsIoctlDev;
  if (!policy.handle_fs) fs = 0;
  RulesetAttr attr{fs, 0, 0};
  size_t attr_size = sizeof(uint64_t);
  if (abi >= 4) {
    attr_size = 2 * sizeof(uint64_t);
    if (policy.deny_tcp && policy.handle_fs) {
      attr.handled_access_net = kNetBindTcp | kNetConnectTcp;
    }
  }
  if (abi >= 6) {
    attr_size = sizeof(RulesetAttr);
    if (policy.scope_signals) attr.scoped |= kScopeSignal;
    if (policy.scope_abstract_unix) attr.scoped |= kScopeAbstractUnix;
  }
  int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0));
  if (ruleset < 0) return std::string("landlock_create_ruleset: ") + std::strerror(errno);

  const uint64_t ro =
      LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  auto add = [&](const std::string& path, uint64_t rights) -> std::string {
    int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) return "";  // absent paths are skipped
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) rights &= kFileRights;
    struct landlock_path_beneath_attr pb = {};
    pb.allowed_access = rights & fs;
    pb.parent_fd = fd;
    long rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    int e = errno;
    close(fd);
    if (rc != 0) return "landlock_add_rule " + path + ": " + std::strerror(e);
    return "";
  };
  for (const std::string& p : policy.read_only) {
    std::string err = add(p, ro);
    if (!err.empty()) return close(ruleset), err;
  }
  for (const std::string& p : policy.read_write) {
    std::string err = add(p, fs);
    if (!err.empty()) return close(ruleset), err;
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    close(ruleset);
    return std::string("PR_SET_NO_NEW_PRIVS: ") + std::strerror(errno);
  }
  long rc = syscall(SYS_landlock_restrict_self, ruleset, 0);
  int e = errno;
  close(ruleset);
  if (rc != 0) return std::string("landlock_restrict_self: ") + std::strerror(e);
  return "";
}

}  // namespace bitroll::sandbox
