// The event loop a library-level test asks for, as the app would choose it.
#pragma once

#include "app/command.h"

#include <string>

namespace tierlab::test {

// The event loop a library-level replay test asks for (replay::Options::io):
// "auto", or TIERLAB_REPLAY_IO when it is set (the CTest pass that runs the
// [replay] tests once more on epoll, tests/CMakeLists.txt), chosen as
// `tierlab replay` chooses (app::io_choice): the replay library reads no
// environment.
inline std::string replay_io() { return app::io_choice("auto", "TIERLAB_REPLAY_IO"); }

}  // namespace tierlab::test
