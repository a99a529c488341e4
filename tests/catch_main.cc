// The main of every CPU test binary: Catch2's session, with a skipped test
// reported through the exit status (tests/catch_session.h).
#define CATCH_CONFIG_RUNNER
#include "tests/catch_session.h"

int main(int argc, char** argv) {
  return kvharbor::testing::RunCatchSession(argc, argv);
}
