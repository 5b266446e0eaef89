// Every record kind's fields, described once. The in-process queue codec
// (capture/queue.cpp), the trace file codec (trace/writer.cpp,
// trace/reader.cpp) and the jsonl export (trace/text.cpp) walk these lists
// instead of spelling the fields out by hand: a field added to a record
// struct in record.h is added here, and reaches all of them (a member
// missing from its list does not compile). A field the trace file should
// store in a coding of its own (delta-coded, packed) is the exception
// writer.cpp and reader.cpp name; the dump line and the csv columns are
// presentations chosen per kind in text.cpp.
//
// Fields<T>::list is a tuple of field(name, &T::member) in the order the
// trace file stores them (docs/trace-format.md); the names are the ones
// `tierlab trace export --format jsonl` prints. A kind that has no fields
// has an empty list.
#pragma once

#include "trace/record.h"

#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

namespace tierlab::trace {

// How a field is stored in a trace file, where its type alone does not say.
enum class Wire : uint8_t {
  Auto,   // by type: strings interned (a string reference), integers as
          // varints (signed ones zigzag), enums as varints, char as a byte
  Bytes,  // a string stored inline as length + bytes, never interned (COPY data)
};

template <class T, class M>
struct Field {
  std::string_view name;
  M T::*member;
  Wire wire = Wire::Auto;

  using Struct = T;
  using Type = M;
  constexpr const M& get(const T& v) const { return v.*member; }
  constexpr M& get(T& v) const { return v.*member; }
};

template <class T, class M>
constexpr Field<T, M> field(std::string_view name, M T::*member, Wire wire = Wire::Auto) {
  return {name, member, wire};
}

// The field list of T; kinds without fields keep the empty primary.
template <class T>
struct Fields {
  static constexpr auto list = std::tuple{};
};

template <>
struct Fields<SessionBegin> {
  static constexpr auto list = std::tuple{
      field("user", &SessionBegin::user),
      field("database", &SessionBegin::database),
      field("application_name", &SessionBegin::application_name),
      field("client_addr", &SessionBegin::client_addr),
      field("backend_pid", &SessionBegin::backend_pid),
      field("flags", &SessionBegin::flags),
  };
};
template <>
struct Fields<SessionEnd> {
  static constexpr auto list = std::tuple{field("reason", &SessionEnd::reason)};
};
template <>
struct Fields<Query> {
  static constexpr auto list = std::tuple{field("sql", &Query::sql)};
};
template <>
struct Fields<Parse> {
  static constexpr auto list = std::tuple{
      field("statement", &Parse::statement),
      field("sql", &Parse::sql),
      field("param_types", &Parse::param_types),
  };
};
template <>
struct Fields<Param> {
  static constexpr auto list = std::tuple{
      field("format", &Param::format),
      field("is_null", &Param::is_null),
      field("value", &Param::value),
  };
};
template <>
struct Fields<Bind> {
  static constexpr auto list = std::tuple{
      field("portal", &Bind::portal),
      field("statement", &Bind::statement),
      field("params", &Bind::params),
      field("result_formats", &Bind::result_formats),
  };
};
template <>
struct Fields<Execute> {
  static constexpr auto list = std::tuple{
      field("portal", &Execute::portal),
      field("max_rows", &Execute::max_rows),
  };
};
template <>
struct Fields<Describe> {
  static constexpr auto list = std::tuple{
      field("target", &Describe::target),
      field("name", &Describe::name),
  };
};
template <>
struct Fields<Close> {
  static constexpr auto list = std::tuple{
      field("target", &Close::target),
      field("name", &Close::name),
  };
};
template <>
struct Fields<CopyData> {
  static constexpr auto list = std::tuple{
      field("direction", &CopyData::dir),
      field("data", &CopyData::data, Wire::Bytes),
  };
};
template <>
struct Fields<CopyDone> {
  static constexpr auto list = std::tuple{field("direction", &CopyDone::dir)};
};
template <>
struct Fields<CopyFail> {
  static constexpr auto list = std::tuple{field("message", &CopyFail::message)};
};
template <>
struct Fields<Result> {
  static constexpr auto list = std::tuple{
      field("tag", &Result::tag),
      field("has_rows", &Result::has_rows),
      field("rows", &Result::rows),
  };
};
template <>
struct Fields<Error> {
  static constexpr auto list = std::tuple{
      field("sqlstate", &Error::sqlstate),
      field("severity", &Error::severity),
      field("message", &Error::message),
  };
};
template <>
struct Fields<Ready> {
  static constexpr auto list = std::tuple{field("status", &Ready::status)};
};
template <>
struct Fields<BlockIo> {
  static constexpr auto list = std::tuple{
      field("op", &BlockIo::op),
      field("device", &BlockIo::device),
      field("offset", &BlockIo::offset),
      field("length", &BlockIo::length),
      field("complete_ns", &BlockIo::complete_ns),
      field("flags", &BlockIo::flags),
      field("pid", &BlockIo::pid),
      field("queued_ns", &BlockIo::queued_ns),
  };
};
template <>
struct Fields<FileIo> {
  static constexpr auto list = std::tuple{
      field("op", &FileIo::op),
      field("file", &FileIo::file),
      field("offset", &FileIo::offset),
      field("length", &FileIo::length),
      field("latency_ns", &FileIo::latency_ns),
      field("flags", &FileIo::flags),
      field("pid", &FileIo::pid),
  };
};
template <>
struct Fields<Sample> {
  static constexpr auto list = std::tuple{
      field("name", &Sample::name),
      field("value", &Sample::value),
  };
};
template <>
struct Fields<Meta> {
  static constexpr auto list = std::tuple{
      field("key", &Meta::key),
      field("value", &Meta::value),
  };
};
template <>
struct Fields<Loss> {
  static constexpr auto list = std::tuple{
      field("what", &Loss::what),
      field("count", &Loss::count),
  };
};

namespace fields_detail {
// Converts to any member type, to count an aggregate's members.
struct AnyMember {
  template <class U>
  constexpr operator U() const;
};
template <class T, class... A>
constexpr size_t member_count() {
  if constexpr (requires { T{A{}..., AnyMember{}}; })
    return member_count<T, A..., AnyMember>();
  else
    return sizeof...(A);
}
template <class T>
constexpr bool lists_every_member() {
  return member_count<T>() == std::tuple_size_v<std::decay_t<decltype(Fields<T>::list)>>;
}
template <size_t... I>
constexpr bool every_kind_lists_every_member(std::index_sequence<I...>) {
  return (lists_every_member<std::variant_alternative_t<I, Body>>() && ...);
}
}  // namespace fields_detail

// A member added to a record struct and not to its list is a compile error
// here, not a field silently left out of the queue, the file and the text.
static_assert(fields_detail::every_kind_lists_every_member(std::make_index_sequence<std::variant_size_v<Body>>{}),
              "a record struct has a member its Fields<T>::list does not name");
static_assert(fields_detail::lists_every_member<Param>());

// Calls f(field) for each field of T, in order.
template <class T, class F>
constexpr void for_each_field(F&& f) {
  std::apply([&](const auto&... fl) { (f(fl), ...); }, Fields<T>::list);
}

// How many string fields T has.
template <class T>
constexpr size_t string_field_count() {
  size_t n = 0;
  std::apply(
      [&](const auto&... f) {
        ((n += std::is_same_v<typename std::decay_t<decltype(f)>::Type, std::string_view>), ...);
      },
      Fields<T>::list);
  return n;
}

// The largest value of an enum a reader accepts; larger stored values read
// as this one (a newer writer's reason or loss kind reads as the catch-all).
template <class E>
constexpr E enum_max();
template <>
constexpr EndReason enum_max<EndReason>() { return EndReason::Unknown; }
template <>
constexpr LossKind enum_max<LossKind>() { return LossKind::Unsupported; }
template <>
constexpr CopyDir enum_max<CopyDir>() { return CopyDir::Out; }
template <>
constexpr IoOp enum_max<IoOp>() { return IoOp::Discard; }

template <class T>
struct is_span : std::false_type {};
template <class E>
struct is_span<std::span<E>> : std::true_type {};
template <class T>
inline constexpr bool is_span_v = is_span<T>::value;

// The kind of a Body alternative.
template <class T, size_t I = 0>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Body>, T>)
    return static_cast<Kind>(I);
  else
    return kind_of<T, I + 1>();
}

}  // namespace tierlab::trace
