// Bad command lines give one line on stderr and exit status 2, through the
// real binary and through app::run_cli.
#include "app/command.h"
#include "support/support.h"
#include "support/unprivileged.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sys/stat.h>
#include <unistd.h>

using tierlab::test::count_lines;
using tierlab::test::run_tierlab;

namespace {

void check_bad_input(const std::vector<std::string>& args, const std::string& mentions) {
  auto r = run_tierlab(args);
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.status == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.out.empty());
  CHECK(r.err.rfind("tierlab: ", 0) == 0);
  CHECK(r.err.find(mentions) != std::string::npos);
}

}  // namespace

TEST_CASE("cli: an unknown subcommand is one line and status 2", "[cli]") {
  check_bad_input({"no-such-command"}, "no-such-command");
}

TEST_CASE("cli: no subcommand at all prints the help, which lists the subcommands, and status 2", "[cli]") {
  auto r = run_tierlab({});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  for (const char* sub : {"sandbox", "capture", "trace", "replay", "iosim", "profile", "project"})
    CHECK(r.err.find(std::string("\n  ") + sub + " ") != std::string::npos);
  // The help as --help prints it, then one line saying what was missing.
  auto help = run_tierlab({"--help"});
  CHECK(help.status == 0);
  CHECK(r.err == help.out + "tierlab: a subcommand is required (see the list above)\n");
  CHECK(tierlab::app::run_cli({}) == 2);
}

TEST_CASE("cli: a subcommand group alone prints the group's help, which lists its subcommands, and status 2",
          "[cli]") {
  for (const char* group : {"capture", "trace", "iosim"}) {
    auto r = run_tierlab({group});
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    auto help = run_tierlab({group, "--help"});
    CHECK(help.status == 0);
    CHECK(r.err == help.out + "tierlab: " + group + ": a subcommand is required (see the list above)\n");
  }
  CHECK(run_tierlab({"capture"}).err.find("\n  proxy ") != std::string::npos);
}

TEST_CASE("cli: an unknown flag is one line and status 2", "[cli]") {
  check_bad_input({"sandbox", "--no-such-flag"}, "--no-such-flag");
}

TEST_CASE("cli: a bad flag value is one line and status 2", "[cli]") {
  check_bad_input({"sandbox", "--port", "notanumber"}, "notanumber");
  check_bad_input({"sandbox", "--port", "70000"}, "--port 70000");
  check_bad_input({"sandbox", "--pgbench-init", "-3"}, "--pgbench-init");
  check_bad_input({"sandbox", "--set", "fsync"}, "--set fsync: expected NAME=VALUE");
}

TEST_CASE("cli: --help exits 0 and lists the subcommands", "[cli]") {
  auto r = run_tierlab({"--help"});
  CHECK(r.status == 0);
  CHECK(r.out.find("sandbox") != std::string::npos);
  auto s = run_tierlab({"sandbox", "--help"});
  CHECK(s.status == 0);
  CHECK(s.out.find("--pgbench-init") != std::string::npos);
  CHECK(s.out.find("--keep-going") != std::string::npos);
  auto v = run_tierlab({"--version"});
  CHECK(v.status == 0);
  CHECK(v.out.find("tierlab") != std::string::npos);
}

TEST_CASE("cli: run_cli parses a vector of strings as the binary would", "[cli]") {
  using tierlab::app::run_cli;
  CHECK(run_cli({"no-such-command"}) == 2);
  CHECK(run_cli({"sandbox", "--port", "notanumber"}) == 2);
  CHECK(run_cli({"sandbox", "--set", "no_equals_sign"}) == 2);
  CHECK(run_cli({"sandbox", "--bogus"}) == 2);
  CHECK(run_cli({"--help"}) == 0);
}

TEST_CASE("cli: an output file appears only when written, and a failed command leaves an existing one as it was", "[cli]") {
  tierlab::test::TempDir dir;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto entries = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++n;
    return n;
  };
  std::string file = dir.file("out.json");
  { tierlab::app::OutputFile f(file, "--json"); }  // the command failed
  CHECK(access(file.c_str(), F_OK) != 0);
  CHECK(entries() == 0);  // no temporary file left either
  {
    tierlab::app::OutputFile f(file, "--json");
    f.write("{}\n");
  }
  CHECK(read(file) == "{}\n");
  // An existing file: a failed command leaves it; a completed one replaces it.
  { tierlab::app::OutputFile f(file, "--json"); }
  CHECK(read(file) == "{}\n");
  {
    tierlab::app::OutputFile f(file, "--json");
    f.write("{\"a\": 1}\n");
  }
  CHECK(read(file) == "{\"a\": 1}\n");
  CHECK(entries() == 1);
  // Through a symbolic link: the file it names is replaced, the link stays.
  std::string link = dir.file("link.json");
  REQUIRE(symlink(file.c_str(), link.c_str()) == 0);
  {
    tierlab::app::OutputFile f(link, "--json");
    f.write("[]\n");
  }
  CHECK(std::filesystem::is_symlink(link));
  CHECK(read(file) == "[]\n");
  // A FIFO (as /dev/stdout or a pipe would be) stays.
  std::string fifo = dir.file("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // so opening it to write does not block
  REQUIRE(reader >= 0);
  { tierlab::app::OutputFile f(fifo, "--json"); }
  close(reader);
  CHECK(access(fifo.c_str(), F_OK) == 0);
  CHECK_THROWS_WITH(tierlab::app::OutputFile(dir.file("no/such/dir/x"), "--json"),
                    Catch::Contains("--json " + dir.file("no/such/dir/x") + ": No such file or directory"));
}

TEST_CASE("cli: --rt without the right to real-time priority is one line naming the flag", "[cli]") {
  const std::string msg = tierlab::test::thrown_unprivileged([] {
    tierlab::app::check_rt(false);  // not asked: nothing checked
    tierlab::app::check_rt(true);
  });
  CHECK(msg.rfind("--rt: real-time priority: sched_setscheduler(SCHED_FIFO) (needs root or CAP_SYS_NICE): ", 0) == 0);
}

TEST_CASE("cli: --compress-level out of range is one line naming the flag and the level, on every capture",
          "[cli]") {
  const std::string range = "--compress-level: 23: must be -100 to 22 (0 writes the trace uncompressed)";
  check_bad_input({"capture", "sniff", "--pcap", "/dev/null", "--out", "/dev/null", "--compress-level", "23"}, range);
  check_bad_input({"capture", "proxy", "--upstream", "127.0.0.1:5432", "--out", "/dev/null", "--compress-level", "23"},
                  range);
  check_bad_input({"capture", "log", "/dev/null", "--out", "/dev/null", "--compress-level", "23"}, range);
}

TEST_CASE("cli: setup_all lists every subcommand, groups and their commands in the order --help shows", "[cli]") {
  CLI::App app;
  tierlab::app::setup_all(app);
  auto names = [](CLI::App& parent) {
    std::vector<std::string> n;
    for (auto* sub : parent.get_subcommands({})) n.push_back(sub->get_name());
    return n;
  };
  CHECK(names(app) == std::vector<std::string>{"capture", "replay", "report", "iosim", "trace", "profile", "tiers",
                                               "project", "sandbox"});
  CHECK(names(*app.get_subcommand("capture")) ==
        std::vector<std::string>{"run", "proxy", "sniff", "block", "import", "log"});
  CHECK(names(*app.get_subcommand("iosim")) == std::vector<std::string>{"simulate", "run", "emulate"});
  CHECK(names(*app.get_subcommand("profile")) == std::vector<std::string>{"synth"});
  // The help shows them in that order too.
  const std::string help = app.help();
  size_t at = 0;
  for (const char* n : {"capture", "replay", "report", "iosim", "trace", "profile", "tiers", "project", "sandbox"}) {
    INFO(n);
    const size_t p = help.find(std::string("\n  ") + n + " ", at);
    REQUIRE(p != std::string::npos);
    at = p + 1;
  }
}

TEST_CASE("cli: capture log on a log no prefix matches names the file and line, and the flag that gives the prefix",
          "[cli]") {
  tierlab::test::TempDir dir;
  const std::string log = dir.file("syslog.log");
  {
    std::ofstream f(log);
    for (int i = 0; i < 30; ++i) f << "Dec  3 10:00:00 host postgres[12]: [1-1] LOG:  statement: SELECT 1\n";
  }
  check_bad_input({"capture", "log", log, "--format", "stderr", "--out", dir.file("t.tlt")},
                  log + ":1: no line of the first 21 matches log_line_prefix");
  auto r = run_tierlab({"capture", "log", log, "--format", "stderr", "--out", dir.file("t.tlt")});
  CHECK(r.err.find("(give the server's with --log-line-prefix)\n") != std::string::npos);
}
