// Internal to sandbox/: the VM tier's task protocol with the /init of scripts/vm-image.sh.
//
// The host appends a second, uncompressed newc cpio archive holding /task/{run.sh, limits,
// stdin, files/, outputs} to the image's initramfs; the guest prints the result between
// @@BITROLL-BEGIN@@ and @@BITROLL-END@@ on the serial console (see scripts/vm-image.sh).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "sandbox/sandbox.h"
#include "schema/status.h"

namespace bitroll::sandbox {

// One newc cpio entry; `data` is written for regular files. Appends to *out.
void AppendCpioEntry(const std::string& name, uint32_t mode, const std::string& data,
                     std::string* out);
// The "TRAILER!!!" entry that ends an archive.
void AppendCpioTrailer(std::string* out);

// `base` (the image's initramfs, padded to 4 bytes) followed by the task archive for `request`.
std::string BuildVmInitrd(const std::string& base, const Request& request);

// Single-quotes `s` for /bin/sh.
std::string ShellQuote(const std::string& s);

// Parses the guest's console output into r (exit status, stdout/stderr, files, and the
// kTimeout / kOutputLimit / kCpuTime classification). Returns false when no complete result
// block was found.
bool ParseVmConsole(const std::string& console, const Request& request, RunResult* r);

// Base64 decoding, whitespace skipped. Returns false on a bad character.
bool Base64Decode(const std::string& in, std::string* out);

}  // namespace bitroll::sandbox
