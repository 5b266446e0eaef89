// The pcap/pcapng reader of `capture sniff` (libpcap, then packet decoding,
// reassembly and the protocol decoder) on a whole file: it either reads or
// throws InputError.
#include "fuzz.h"

#include "capture/sniff.h"

#include <sstream>
#include <sys/mman.h>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlab;
  static int fd = memfd_create("fuzz.pcap", 0);
  if (fd < 0) fuzz::fail("memfd_create");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    fuzz::fail("writing the input file");
  capture::SniffOptions o;
  o.pcap_file = "/proc/self/fd/" + std::to_string(fd);
  o.out = "/dev/null";
  o.compression_level = 0;
  o.max_connections = 8;
  o.reassembly_bytes = 64 * 1024;
  std::ostringstream log;
  try {
    auto s = capture::run_sniff(o, log);
    fuzz::check(s.sessions >= s.joined, "joined sessions are sessions");
  } catch (const InputError&) {
  }
  return 0;
}
