#include "pgtmp/pgtmp.h"

#include <catch2/catch.hpp>
#include <unistd.h>

TEST_CASE("pgtmp: find_bindir finds postgres and initdb", "[pgtmp]") {
  const std::string dir = tierlab::pgtmp::find_bindir();
  CHECK(access((dir + "/postgres").c_str(), X_OK) == 0);
  CHECK(access((dir + "/initdb").c_str(), X_OK) == 0);
}

TEST_CASE("pgtmp: free_port gives a usable port", "[pgtmp]") {
  const int a = tierlab::pgtmp::free_port();
  CHECK(a > 1024);
  CHECK(a < 65536);
}
