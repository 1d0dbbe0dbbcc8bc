// The VM task protocol without booting a VM: cpio layout, quoting, base64 and console parsing.
#include "sandbox/vm_task.h"

#include <signal.h>

#include <cstdio>

#include "gtest/gtest.h"

namespace bitroll::sandbox {
namespace {

TEST(VmTask, CpioEntryFollowsNewcLayout) {
  std::string out;
  AppendCpioEntry("ab", 0100644, "xyz", &out);
  // 110-byte header, "ab\0" padded to 4 (113 -> 116), 3 data bytes padded to 4 (-> 120).
  ASSERT_EQ(out.size(), 120u);
  EXPECT_EQ(out.substr(0, 6), "070701");
  EXPECT_EQ(out.substr(6 + 8, 8), "000081A4");       // mode 0100644
  EXPECT_EQ(out.substr(6 + 6 * 8, 8), "00000003");   // filesize
  EXPECT_EQ(out.substr(6 + 11 * 8, 8), "00000003");  // namesize including the NUL
  EXPECT_EQ(out.substr(110, 3), std::string("ab\0", 3));
  EXPECT_EQ(out.substr(116, 3), "xyz");
  std::string dir;
  AppendCpioEntry("d", 040755, "ignored", &dir);
  EXPECT_EQ(dir.size(), 112u);  // header + "d\0": no data for a folder
  EXPECT_EQ(dir.substr(6 + 6 * 8, 8), "00000000");
}

TEST(VmTask, InitrdKeepsTheBaseAndAlignsTheTask) {
  Request r;
  r.argv = {"echo", "hi"};
  r.files["a.txt"] = "A";
  std::string initrd = BuildVmInitrd("12345", r);
  EXPECT_EQ(initrd.substr(0, 5), "12345");
  EXPECT_EQ(initrd.substr(5, 3), std::string(3, '\0'));
  EXPECT_EQ(initrd.substr(8, 6), "070701");
  EXPECT_NE(initrd.find("task/files/a.txt"), std::string::npos);
  EXPECT_NE(initrd.find("exec 'echo' 'hi'"), std::string::npos);
  EXPECT_NE(initrd.find("TRAILER!!!"), std::string::npos);
  EXPECT_EQ(initrd.size() % 4, 0u);
}

TEST(VmTask, ShellQuoteRoundTripsThroughSh) {
  const std::string nasty = "it's $(echo no) `x` \"q\" \\ ;|&";
  std::string cmd = "printf %s " + ShellQuote(nasty);
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string got;
  char buf[256];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) got.append(buf, n);
  pclose(p);
  EXPECT_EQ(got, nasty);
}

TEST(VmTask, Base64DecodesRfc4648Vectors) {
  const char* vectors[][2] = {{"", ""},
                              {"Zg==", "f"},
                              {"Zm8=", "fo"},
                              {"Zm9v", "foo"},
                              {"Zm9vYg==", "foob"},
                              {"Zm9vYmE=", "fooba"},
                              {"Zm9v\nYmFy", "foobar"}};
  for (auto& v : vectors) {
    std::string out;
    ASSERT_TRUE(Base64Decode(v[0], &out)) << v[0];
    EXPECT_EQ(out, v[1]) << v[0];
  }
  std::string out;
  EXPECT_FALSE(Base64Decode("Zm9v!", &out));
}

// A console transcript written by hand in the format of scripts/vm-image.sh's /init.
TEST(VmTask, ParsesConsoleTranscript) {
  const std::string console =
      "[    0.3] PCI: Fatal: No config space access function found\r\n"
      "@@BITROLL-BEGIN@@\r\n"
      "rc 3\r\n"
      "timedout 0\r\n"
      "stdout 6\r\naGVsbG8K\r\n@@\r\n"    // "hello\n"
      "stderr 4\r\nZXJyCg==\r\n@@\r\n"    // "err\n"
      "file out.txt 3\r\nYWJj\r\n@@\r\n"  // "abc"
      "@@BITROLL-END@@\r\n[    1.5] reboot: Restarting system\r\n";
  Request req;
  req.limits.max_file_bytes = 2;
  RunResult r;
  ASSERT_TRUE(ParseVmConsole(console, req, &r));
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.stdout_data, "hello\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  EXPECT_EQ(r.files["out.txt"].data, "ab");
  EXPECT_TRUE(r.files["out.txt"].truncated);
  EXPECT_EQ(r.error, SandboxError::kNone);

  RunResult t;
  std::string timed = "@@BITROLL-BEGIN@@\nrc 137\ntimedout 1\nstdout 0\n@@\n@@BITROLL-END@@\n";
  ASSERT_TRUE(ParseVmConsole(timed, req, &t));
  EXPECT_FALSE(t.exited);
  EXPECT_EQ(t.term_signal, SIGKILL);
  EXPECT_EQ(t.error, SandboxError::kTimeout);

  RunResult o;
  req.limits.max_output_bytes = 4;
  std::string big =
      "@@BITROLL-BEGIN@@\nrc 141\ntimedout 0\nstdout 5\naGVsbG8=\n@@\n@@BITROLL-END@@";
  ASSERT_TRUE(ParseVmConsole(big, req, &o));
  EXPECT_EQ(o.stdout_data, "hell");
  EXPECT_TRUE(o.stdout_truncated);
  EXPECT_EQ(o.error, SandboxError::kOutputLimit);

  RunResult none;
  EXPECT_FALSE(ParseVmConsole("kernel panic\n", req, &none));
  EXPECT_FALSE(ParseVmConsole("@@BITROLL-BEGIN@@\nrc 0\n", req, &none));  // cut off
}

}  // namespace
}  // namespace bitroll::sandbox
