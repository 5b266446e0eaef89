// Rules of the source tree that a review would otherwise have to keep:
// every clock is read through common/clock.h (now_ns, clock_ns,
// sleep_until_ns), and tierlab's environment overrides (TIERLAB_*) are read
// by the app alone. Scans the tree's sources (TIERLAB_SOURCE_DIR, given by
// CMake) but tests/ and bench/'s C programs.
#include "support/support.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace srcrules_fs = std::filesystem;

// The folders whose .cpp and .h files the rules cover.
const char* const kSrcRulesDirs[] = {"app", "bench", "capture", "common", "iosim", "models",
                                     "pgtmp", "replay", "tiers", "trace"};

// A direct clock read or clock sleep: what common/clock.h wraps.
const std::regex kSrcRulesClockRead(
    R"(\b(clock_gettime|clock_nanosleep|gettimeofday|timespec_get)\s*\(|_clock::now\s*\(|(^|[^_\w.>])(::)?time\s*\(\s*(nullptr|NULL|0)?\s*\))");

// A TIERLAB_* environment variable named in a string.
const std::regex kSrcRulesTierlabEnv(R"re("TIERLAB_[A-Z_]+")re");

struct SrcRulesHit {
  std::string where;  // path:line
  std::string line;
};

// The file's lines with // comments cut off.
std::vector<std::string> srcrules_code_lines(const srcrules_fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    const auto c = l.find("//");
    if (c != std::string::npos) l.resize(c);
    lines.push_back(l);
  }
  return lines;
}

// Every source file of the rules' folders, as a path from the tree's root.
std::vector<std::string> srcrules_files() {
  std::vector<std::string> out;
  const srcrules_fs::path root = TIERLAB_SOURCE_DIR;
  for (const char* d : kSrcRulesDirs) {
    if (!srcrules_fs::exists(root / d)) continue;
    for (const auto& e : srcrules_fs::recursive_directory_iterator(root / d)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".h"))
        out.push_back(srcrules_fs::relative(e.path(), root).string());
    }
  }
  return out;
}

std::vector<SrcRulesHit> srcrules_scan(const std::regex& rule, bool (*exempt)(const std::string&)) {
  std::vector<SrcRulesHit> hits;
  for (const auto& f : srcrules_files()) {
    if (exempt(f)) continue;
    const auto lines = srcrules_code_lines(srcrules_fs::path(TIERLAB_SOURCE_DIR) / f);
    for (size_t i = 0; i < lines.size(); ++i)
      if (std::regex_search(lines[i], rule)) hits.push_back({f + ":" + std::to_string(i + 1), lines[i]});
  }
  return hits;
}

std::string srcrules_list(const std::vector<SrcRulesHit>& hits) {
  std::ostringstream o;
  for (const auto& h : hits) o << h.where << ": " << h.line << "\n";
  return o.str();
}

bool srcrules_clock_exempt(const std::string& f) {
  // clock.h is where the reads live.
  return f == "common/clock.h";
}

bool srcrules_env_exempt(const std::string& f) { return f.rfind("app/", 0) == 0; }

}  // namespace

TEST_CASE("the rules' patterns find what they are meant to", "[source]") {
  for (const char* read : {"clock_gettime(CLOCK_REALTIME, &t);", "auto t = std::chrono::steady_clock::now();",
                           "x = std::chrono::system_clock::now()", "return ::time(nullptr);", "time(NULL)", "std::time(nullptr)",
                           "gettimeofday(&tv, nullptr)", "while (::clock_nanosleep(CLOCK_MONOTONIC, 0, &t, 0))"}) {
    INFO(read);
    CHECK(std::regex_search(std::string(read), kSrcRulesClockRead));
  }
  for (const char* fine : {"now_ns()", "clock_ns(CLOCK_REALTIME)", "sleep_until_ns(t)", "b.complete_ns - r.ts",
                           "s.time(x)", "wall_time()", "mtime(nullptr)", "start_time ()"}) {
    INFO(fine);
    CHECK_FALSE(std::regex_search(std::string(fine), kSrcRulesClockRead));
  }
  CHECK(std::regex_search(std::string(R"(io_choice(o.io, "TIERLAB_REPLAY_IO"))"), kSrcRulesTierlabEnv));
  CHECK_FALSE(std::regex_search(std::string("#define TIERLAB_BENCH_RELAY_NET_H"), kSrcRulesTierlabEnv));
  CHECK(srcrules_files().size() > 100);
}

TEST_CASE("every clock is read through common/clock.h", "[source]") {
  const auto hits = srcrules_scan(kSrcRulesClockRead, srcrules_clock_exempt);
  INFO("read the clock with now_ns() or clock_ns() and sleep with sleep_until_ns() (common/clock.h):\n"
       << srcrules_list(hits));
  CHECK(hits.empty());
}

TEST_CASE("TIERLAB_* environment overrides are read in app/ only", "[source]") {
  const auto hits = srcrules_scan(kSrcRulesTierlabEnv, srcrules_env_exempt);
  INFO("libraries take these settings as options; the app reads the environment:\n" << srcrules_list(hits));
  CHECK(hits.empty());
}
