// config_test.cpp - the C++ layer of the one config vocabulary (core/config.h):
// every bad-input case of the key table is an error naming the key, never a
// clamp; ArenaConfig{} holds the table's defaults; aliases set the same field.
// Built and run by `make test-cpp` (no torch, no device).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/config.h"

using namespace renaissance;
using config_table::Value;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

// set_key must throw std::invalid_argument whose message names `key`, and
// leave the config as it was.
void expect_rejected(const std::string& key, const Value& v, const std::string& why) {
  ArenaConfig c;
  const ArenaConfig before = c;
  try {
    config_table::set_key(c, key, v);
    check(false, key + " accepted " + why);
  } catch (const std::invalid_argument& e) {
    check(std::string(e.what()).find("'" + key + "'") != std::string::npos,
          key + ": message names the key (" + e.what() + ")");
  }
  for (const config_table::Key& k : config_table::kConfigKeys) {
    if (k.alias_of) continue;
    check(config_table::get_key(c, k.name) == config_table::get_key(before, k.name),
          key + " rejected but changed " + k.name);
  }
}

void expect_validate_rejects(const ArenaConfig& c, const std::string& key) {
  try {
    config_table::validate(c);
    check(false, "validate accepted a bad " + key);
  } catch (const std::invalid_argument& e) {
    check(std::string(e.what()).find("'" + key + "'") != std::string::npos,
          "validate names " + key + " (" + e.what() + ")");
  }
}

}  // namespace

int main() {
  // Defaults: the table's text equals ArenaConfig{}'s fields.
  const ArenaConfig d;
  for (const config_table::Key& k : config_table::kConfigKeys) {
    if (k.alias_of) continue;
    check(config_table::get_key(d, k.name) == k.default_text,
          std::string(k.name) + " default " + config_table::get_key(d, k.name) + " vs table " +
              k.default_text);
  }

  // Every bound of every integer and float key: the bound is accepted, one
  // past it is rejected (no clamp).
  for (const config_table::Key& k : config_table::kConfigKeys) {
    if (k.type == config_table::Type::kUInt) {
      const auto lo = static_cast<std::uint64_t>(k.min);
      const auto hi = static_cast<std::uint64_t>(k.max);
      ArenaConfig c;
      config_table::set_key(c, k.name, Value::of_uint(lo));
      config_table::set_key(c, k.name, Value::of_uint(hi));
      if (lo > 0) expect_rejected(k.name, Value::of_uint(lo - 1), "below its minimum");
      expect_rejected(k.name, Value::of_uint(hi + 1), "above its maximum");
      expect_rejected(k.name, Value::of_bool(true), "a bool");
      expect_rejected(k.name, Value::of_float(static_cast<double>(lo)), "a float");
      expect_rejected(k.name, Value::of_text("1"), "text");
    } else if (k.type == config_table::Type::kFloat) {
      ArenaConfig c;
      config_table::set_key(c, k.name, Value::of_float(k.min));
      config_table::set_key(c, k.name, Value::of_float(k.max));
      config_table::set_key(c, k.name, Value::of_uint(1));  // an int is a number
      expect_rejected(k.name, Value::of_float(std::nextafter(k.min, -1.0)), "below its minimum");
      expect_rejected(k.name, Value::of_float(std::nextafter(k.max, 1e300)), "above its maximum");
      expect_rejected(k.name, Value::of_float(std::nan("")), "NaN");
      expect_rejected(k.name, Value::of_float(std::numeric_limits<double>::infinity()), "inf");
      expect_rejected(k.name, Value::of_bool(false), "a bool");
    } else if (k.type == config_table::Type::kBool) {
      expect_rejected(k.name, Value::of_uint(1), "an int");
      expect_rejected(k.name, Value::of_text("true"), "text");
    } else {
      expect_rejected(k.name, Value::of_text("Defer"), "a choice in another case");
      expect_rejected(k.name, Value::of_text(""), "an empty choice");
      expect_rejected(k.name, Value::of_uint(0), "an int");
    }
  }

  // The cases the issue names: no clamp of max_variants = 0.
  expect_rejected("max_variants", Value::of_uint(0), "0 (was clamped to 1)");
  expect_rejected("large_segment", Value::of_uint(0), "0");
  expect_rejected("small_segment", Value::of_uint(4096), "below small_size");
  expect_rejected("no_such_key", Value::of_uint(1), "an unknown key");

  // Aliases set the same field in another unit.
  {
    ArenaConfig a, b;
    config_table::set_key(a, "max_reserved_mb", Value::of_uint(3));
    config_table::set_key(b, "max_reserved_bytes", Value::of_uint(3u << 20));
    check(a.max_reserved_bytes == (3u << 20) && b.max_reserved_bytes == a.max_reserved_bytes,
          "max_reserved_mb is MiB of max_reserved_bytes");
    config_table::set_key(a, "plan_budget_ms", Value::of_uint(1500));
    config_table::set_key(b, "plan_budget_seconds", Value::of_float(1.5));
    check(a.plan_budget_seconds == 1.5 && b.plan_budget_seconds == 1.5,
          "plan_budget_ms and plan_budget_seconds set one budget");
    check(config_table::get_key(a, "plan_budget_ms") == "1500", "plan_budget_ms reads back as 1500");
  }

  // validate(): a config built in C++ is checked against the same ranges.
  config_table::validate(ArenaConfig{});
  {
    ArenaConfig c;
    c.max_variants = 0;
    expect_validate_rejects(c, "max_variants");
    c = ArenaConfig{};
    c.plan_budget_seconds = -0.001;
    expect_validate_rejects(c, "plan_budget_seconds");
    c = ArenaConfig{};
    c.plan_budget_seconds = std::nan("");
    expect_validate_rejects(c, "plan_budget_seconds");
    c = ArenaConfig{};
    c.large_segment = (std::size_t(10) << 20) - 512;
    expect_validate_rejects(c, "large_segment");
    c = ArenaConfig{};
    c.small_segment = 0;
    expect_validate_rejects(c, "small_segment");
    c = ArenaConfig{};
    c.range_bytes = std::size_t(1) << 49;
    expect_validate_rejects(c, "range_bytes");
    c = ArenaConfig{};
    c.max_reserved_bytes = (std::size_t(1) << 63) + 1;
    expect_validate_rejects(c, "max_reserved_bytes");
    c = ArenaConfig{};
    c.plan_threads = 0;
    expect_validate_rejects(c, "plan_threads");
    c = ArenaConfig{};
    c.plan_threads = 3;
    expect_validate_rejects(c, "plan_threads");
  }

  // Every key's name is unique and an alias points at a key.
  for (const config_table::Key& k : config_table::kConfigKeys) {
    int same = 0;
    for (const config_table::Key& j : config_table::kConfigKeys) same += std::string(j.name) == k.name;
    check(same == 1, std::string(k.name) + " appears once");
    if (k.alias_of) {
      check(config_table::find_key(k.alias_of) != nullptr && !config_table::find_key(k.alias_of)->alias_of,
            std::string(k.name) + " is an alias of a key");
    }
  }

  if (failures) {
    std::fprintf(stderr, "config_test: %d failures\n", failures);
    return 1;
  }
  std::printf("config_test: ok\n");
  return 0;
}
