// The per-session state machine of the replay engine.
//
// Each replayed session is one slot of a worker and is always in one of
// these states. The worker moves it only through transition(), so the
// allowed exits are written down in one place (and tested).
#pragma once

#include <cstdint>

namespace tierlab::replay {

enum class State : uint8_t {
  // Every state but Done also exits on Stopped -> Done (the replay was
  // asked to stop: SIGINT, SIGTERM).
  // Before its captured start, or (max speed) until enough earlier sessions
  // ended. A timer is armed. Exits: Due -> Connecting; Failed -> Done.
  Pending,
  // The connection thread is opening the connection.
  // Exits: Connected -> Idle; Failed -> Done.
  Connecting,
  // Connected, no unit in flight; a timer is armed for the next unit's
  // scheduled send or for the session's captured end.
  // Exits: UnitSent -> Busy; Ended -> Done; Failed -> Done.
  Idle,
  // A unit was handed to libpq (maybe still flushing); results awaited.
  // Exits: UnitDone -> Idle; CopyInStarted -> CopyIn;
  //        CopyOutStarted -> CopyOut; Failed -> Done.
  Busy,
  // The server asked for COPY data; captured chunks are being queued.
  // Exits: CopyFinished -> Busy; Failed -> Done.
  CopyIn,
  // COPY TO STDOUT data is being drained and dropped.
  // Exits: CopyFinished -> Busy; Failed -> Done.
  CopyOut,
  // Connection closed (cleanly at the captured end, or lost). No exits.
  Done,
  // Not a state: the result of a transition that is not allowed.
  Invalid,
};

enum class Event : uint8_t {
  Due, Connected, UnitSent, UnitDone, CopyInStarted, CopyOutStarted,
  CopyFinished, Ended, Failed, Stopped,
};

constexpr State transition(State s, Event e) {
  if (e == Event::Stopped) return s == State::Done || s == State::Invalid ? State::Invalid : State::Done;
  switch (s) {
    case State::Pending:
      if (e == Event::Due) return State::Connecting;
      if (e == Event::Failed) return State::Done;
      break;
    case State::Connecting:
      if (e == Event::Connected) return State::Idle;
      if (e == Event::Failed) return State::Done;
      break;
    case State::Idle:
      if (e == Event::UnitSent) return State::Busy;
      if (e == Event::Ended || e == Event::Failed) return State::Done;
      break;
    case State::Busy:
      if (e == Event::UnitDone) return State::Idle;
      if (e == Event::CopyInStarted) return State::CopyIn;
      if (e == Event::CopyOutStarted) return State::CopyOut;
      if (e == Event::Failed) return State::Done;
      break;
    case State::CopyIn:
    case State::CopyOut:
      if (e == Event::CopyFinished) return State::Busy;
      if (e == Event::Failed) return State::Done;
      break;
    case State::Done:
    case State::Invalid:
      break;
  }
  return State::Invalid;
}

const char* state_name(State s);

}  // namespace tierlab::replay
