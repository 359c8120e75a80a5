// config.cpp - checks and sets ArenaConfig fields by key (see config.h).
#include "core/config.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace renaissance {
namespace config_table {
namespace {

std::string number_text(double x, Type t) {
  char buf[64];
  if (t == Type::kUInt) {
    std::snprintf(buf, sizeof buf, "%.0f", x);
  } else {
    std::snprintf(buf, sizeof buf, "%.17g", x);
  }
  return buf;
}

std::string range_text(const Key& k) {
  return "[" + number_text(k.min, k.type) + ", " + number_text(k.max, k.type) + "]";
}

[[noreturn]] void bad(const Key& k, const std::string& want, const std::string& got) {
  throw std::invalid_argument("arena option '" + std::string(k.name) + "' must be " + want +
                              ", got " + got);
}

// The whole-number value of an unsigned key, checked against its range.
std::uint64_t checked_uint(const Key& k, const Value& v) {
  if (v.type != Type::kUInt) bad(k, "an integer", v.type == Type::kBool ? "a bool" : "another type");
  // The bounds are powers of two or small integers, exact in a double (and
  // so in an uint64); the value is compared as an integer (2**63 + 1 is not
  // a double).
  if (v.u < static_cast<std::uint64_t>(k.min) || v.u > static_cast<std::uint64_t>(k.max)) {
    bad(k, "an integer in " + range_text(k), std::to_string(v.u));
  }
  return v.u;
}

double checked_float(const Key& k, const Value& v) {
  double d = 0.0;
  if (v.type == Type::kFloat) d = v.d;
  else if (v.type == Type::kUInt) d = static_cast<double>(v.u);
  else bad(k, "a number", v.type == Type::kBool ? "a bool" : "another type");
  if (!(d >= k.min && d <= k.max)) bad(k, "a number in " + range_text(k), number_text(d, k.type));
  return d;
}

StreamPolicy checked_policy(const Key& k, const Value& v) {
  if (v.type != Type::kChoice) bad(k, "one of " + std::string(k.choices), "another type");
  if (v.s == "defer") return StreamPolicy::kDefer;
  if (v.s == "wait") return StreamPolicy::kWait;
  bad(k, "'defer' or 'wait'", "'" + v.s + "'");
}

bool checked_bool(const Key& k, const Value& v) {
  if (v.type != Type::kBool) bad(k, "a bool", "another type");
  return v.b;
}

}  // namespace

const Key* find_key(std::string_view name) {
  for (const Key& k : kConfigKeys) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

void set_key(ArenaConfig& c, std::string_view name, const Value& v) {
  const Key* k = find_key(name);
  if (!k) throw std::invalid_argument("unknown arena option '" + std::string(name) + "'");
  const std::string_view n = k->name;
  if (n == "max_reserved_mb") c.max_reserved_bytes = checked_uint(*k, v) << 20;
  else if (n == "max_reserved_bytes") c.max_reserved_bytes = checked_uint(*k, v);
  else if (n == "expandable_segments") c.expandable_segments = checked_bool(*k, v);
  else if (n == "stream_policy") c.stream_policy = checked_policy(*k, v);
  else if (n == "planning") c.planning = checked_bool(*k, v);
  else if (n == "max_variants") c.max_variants = checked_uint(*k, v);
  else if (n == "plan_budget_ms") c.plan_budget_seconds = checked_uint(*k, v) / 1000.0;
  else if (n == "plan_budget_seconds") c.plan_budget_seconds = checked_float(*k, v);
  else if (n == "plan_deterministic") c.plan_deterministic = checked_bool(*k, v);
  else if (n == "plan_threads") c.plan_threads = static_cast<unsigned>(checked_uint(*k, v));
  else if (n == "range_bytes") c.range_bytes = checked_uint(*k, v);
  else if (n == "small_segment") c.small_segment = checked_uint(*k, v);
  else if (n == "large_segment") c.large_segment = checked_uint(*k, v);
  else throw std::logic_error("config key '" + std::string(n) + "' has no field");  // table bug
}

std::string get_key(const ArenaConfig& c, std::string_view name) {
  if (name == "max_reserved_bytes") return std::to_string(c.max_reserved_bytes);
  if (name == "expandable_segments") return c.expandable_segments ? "True" : "False";
  if (name == "stream_policy") return c.stream_policy == StreamPolicy::kWait ? "wait" : "defer";
  if (name == "planning") return c.planning ? "True" : "False";
  if (name == "max_variants") return std::to_string(c.max_variants);
  if (name == "plan_budget_ms") {
    return number_text(c.plan_budget_seconds * 1000.0, Type::kFloat);
  }
  if (name == "plan_deterministic") return c.plan_deterministic ? "True" : "False";
  if (name == "plan_threads") return std::to_string(c.plan_threads);
  if (name == "range_bytes") return std::to_string(c.range_bytes);
  if (name == "small_segment") return std::to_string(c.small_segment);
  if (name == "large_segment") return std::to_string(c.large_segment);
  throw std::invalid_argument("no config field is read by the key '" + std::string(name) + "'");
}

void validate(const ArenaConfig& c) {
  // Each field through its key, so that the ranges are the table's.
  ArenaConfig scratch;
  set_key(scratch, "max_reserved_bytes", Value::of_uint(c.max_reserved_bytes));
  set_key(scratch, "max_variants", Value::of_uint(c.max_variants));
  set_key(scratch, "plan_budget_seconds", Value::of_float(c.plan_budget_seconds));
  set_key(scratch, "plan_threads", Value::of_uint(c.plan_threads));
  set_key(scratch, "range_bytes", Value::of_uint(c.range_bytes));
  set_key(scratch, "small_segment", Value::of_uint(c.small_segment));
  set_key(scratch, "large_segment", Value::of_uint(c.large_segment));
  if (c.stream_policy != StreamPolicy::kDefer && c.stream_policy != StreamPolicy::kWait) {
    throw std::invalid_argument("arena option 'stream_policy' must be 'defer' or 'wait'");
  }
}

}  // namespace config_table
}  // namespace renaissance
