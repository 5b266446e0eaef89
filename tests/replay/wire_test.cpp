// The replay's own protocol messages and what it reads from the server's:
// byte layouts as the protocol documentation gives them, SQLSTATE from
// (maybe cut) errors.
#include "replay/wire.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace tierlab;
using namespace tierlab::replay;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

}  // namespace

TEST_CASE("request messages are laid out as the protocol defines them", "[replay][wire]") {
  std::string out;
  wire::query(out, "SELECT 1");
  CHECK(out == std::string("Q") + bytes({0, 0, 0, 13}) + std::string("SELECT 1\0", 9));

  out.clear();
  uint32_t types[] = {23, 25};
  wire::parse(out, "s1", "SELECT $1", types, 2);
  CHECK(out == std::string("P") + bytes({0, 0, 0, 27}) + std::string("s1\0SELECT $1\0", 13) +
                   bytes({0, 2, 0, 0, 0, 23, 0, 0, 0, 25}));

  // Bind as sent: its portal, a format code per parameter, a NULL, the
  // result format codes.
  out.clear();
  const std::string bin("\x01\x02", 2);
  std::vector<trace::Param> params{trace::Param{0, false, "42"}, trace::Param{0, true, ""},
                                   trace::Param{1, false, bin}};
  std::vector<int16_t> results{1, 0};
  wire::bind(out, "c1", "s1", params, results);
  std::string body = std::string("c1\0s1\0", 6) + bytes({0, 3, 0, 0, 0, 0, 0, 1}) + bytes({0, 3}) +
                     bytes({0, 0, 0, 2}) + "42" + bytes({0xff, 0xff, 0xff, 0xff}) + bytes({0, 0, 0, 2, 1, 2}) +
                     bytes({0, 2, 0, 1, 0, 0});
  CHECK(out == std::string("B") + bytes({0, 0, 0, static_cast<int>(body.size() + 4)}) + body);

  out.clear();
  wire::describe(out, 'P', "");
  wire::execute(out, "c1", 50);
  wire::close(out, 'S', "s1");
  wire::flush(out);
  wire::sync(out);
  CHECK(out == std::string("D") + bytes({0, 0, 0, 6, 'P', 0}) + std::string("E") +
                   bytes({0, 0, 0, 11, 'c', '1', 0, 0, 0, 0, 50}) + std::string("C") +
                   bytes({0, 0, 0, 8, 'S', 's', '1', 0}) + std::string("H") + bytes({0, 0, 0, 4}) + std::string("S") +
                   bytes({0, 0, 0, 4}));

  out.clear();
  wire::copy_data(out, "1\n");
  wire::copy_done(out);
  wire::copy_fail(out, "no");
  CHECK(out == std::string("d") + bytes({0, 0, 0, 6, '1', '\n'}) + std::string("c") + bytes({0, 0, 0, 4}) +
                   std::string("f") + bytes({0, 0, 0, 7, 'n', 'o', 0}));
  CHECK(wire::get32(out.data() + 1) == 6);
}

TEST_CASE("SQLSTATE is read from ErrorResponse fields, XX000 when missing or cut off", "[replay][wire]") {
  char state[6];
  std::string e = std::string("SERROR\0VERROR\0C42P01\0Mrelation does not exist\0\0", 46);
  wire::error_sqlstate(e.data(), e.size(), state);
  CHECK(std::string(state) == "42P01");
  std::string none = std::string("SERROR\0Mno code\0\0", 17);
  wire::error_sqlstate(none.data(), none.size(), state);
  CHECK(std::string(state) == "XX000");
  // Cut inside the code field: not taken.
  wire::error_sqlstate(e.data(), 17, state);
  CHECK(std::string(state) == "XX000");
  // Cut after it: taken.
  wire::error_sqlstate(e.data(), 21, state);
  CHECK(std::string(state) == "42P01");
  wire::error_sqlstate(e.data(), 0, state);
  CHECK(std::string(state) == "XX000");
}
