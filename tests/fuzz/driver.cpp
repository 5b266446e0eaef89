// Runs every file of the given corpus directories (or files) through the
// target's LLVMFuzzerTestOneInput once: the ordinary build's regression test
// of a fuzz target. Exits 1 if there is no input at all.
#include "fuzz.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t n = 0;
  auto run = [&](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::cerr << p.string() << ": cannot read\n";
      std::exit(1);
    }
    std::cerr << "running " << p.string() << " (" << bytes.size() << " bytes)\n";
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    ++n;
  };
  for (int i = 1; i < argc; ++i) {
    fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) run(f);
    } else {
      run(p);
    }
  }
  if (n == 0) {
    std::cerr << "no corpus input found\n";
    return 1;
  }
  std::cout << n << " inputs ran\n";
  return 0;
}
