// Every test case must reach CTest as itself: catch_discover_tests hands the
// names to CTest as a list, so a ';' in a name splits it into pieces that run
// nothing and still pass; and CTest runs each by passing its name to the test
// binary, which takes a name starting with '-' for an option it refuses.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

TEST_CASE("test case names hold nothing CTest would split", "[meta]") {
  namespace fs = std::filesystem;
  const std::regex test_case(R"re(TEST_CASE\(\s*"((?:[^"\\]|\\.)*)")re");
  std::vector<std::string> bad;
  size_t seen = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(TIERLAB_SOURCE_DIR) / "tests")) {
    if (!e.is_regular_file() || e.path().extension() != ".cpp") continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), test_case), end; it != end; ++it) {
      ++seen;
      const std::string name = (*it)[1];
      if (name.find_first_of(";[]") != std::string::npos || name.rfind('-', 0) == 0)
        bad.push_back(e.path().filename().string() + ": " + name);
    }
  }
  CHECK(seen > 100);
  for (const auto& b : bad) UNSCOPED_INFO(b);
  CHECK(bad.empty());
}
