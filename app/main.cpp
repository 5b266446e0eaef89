#include "app/command.h"

#include <csignal>

// The subcommands are listed in app/command.cpp (setup_all), which
// app::run_cli builds the CLI from: the tests run the same CLI without this
// file.
int main(int argc, char** argv) {
  // A closed socket or pipe is an error to handle, not a reason to die.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  return tierlab::app::run_cli(args);
}
