// config.h - the arena's configuration and the ONE table of its keys.
//
// Every layer reads the same table (kConfigKeys below): the arena's
// constructor validates an ArenaConfig against it, the Python bindings turn
// keyword arguments into an ArenaConfig through set_config_key(), the Python
// parser of install() and TORCH_RENAISSANCE_CONF takes names, types and
// ranges from it (torch_renaissance._C.config_keys()), and the README's
// table is generated from it (tools/config_table.py; a test compares them).
//
// Invariants (tests/cpp/config_test.cpp and tests/test_config_keys.py):
//   * A key's value outside [min, max] (or not one of its choices) is an
//     error in every layer, never clamped or rounded into range.
//   * ArenaConfig{}'s fields equal the table's defaults.
//   * An alias (max_reserved_mb, plan_budget_seconds) sets the same field as
//     its key in another unit; giving both in one source is an error.
//   * Cross-key rules that depend on the device (multiples of its alignment,
//     small_segment >= small_size) stay in Arena's constructor, which throws
//     std::invalid_argument naming the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace renaissance {

enum class StreamPolicy : std::uint8_t {
  kDefer,  // pending blocks wait until their event completes (like PyTorch)
  kWait,   // the allocating stream waits on the event (like cudaMallocAsync)
};

struct ArenaConfig {
  std::size_t max_reserved_bytes = 0;  // 0: no limit
  bool expandable_segments = true;     // used when the backend supports ranges
  std::size_t range_bytes = 0;         // address space per expandable segment (0: auto)
  StreamPolicy stream_policy = StreamPolicy::kDefer;
  // Planned steps.
  bool planning = true;
  std::size_t max_variants = 8;
  double plan_budget_seconds = 0.25;
  bool plan_deterministic = false;
  unsigned plan_threads = 2;
  // Pool geometry (PyTorch's defaults).
  std::size_t small_size = std::size_t(1) << 20;
  std::size_t small_segment = std::size_t(2) << 20;
  std::size_t large_segment = std::size_t(20) << 20;
  std::size_t min_large_alloc = std::size_t(10) << 20;
  std::size_t round_large = std::size_t(2) << 20;
};

namespace config_table {

enum class Type { kBool, kUInt, kFloat, kChoice };

// One configuration key. Integers and floats have an inclusive range;
// choices are '|'-separated. An alias names the key whose field it sets and
// the factor from its unit to that key's unit.
struct Key {
  const char* name;
  Type type;
  const char* unit;         // "bytes", "MiB", "ms", "s", "count", "" (bool, choice)
  const char* default_text;  // as written in TORCH_RENAISSANCE_CONF
  double min;                // kUInt, kFloat
  double max;
  const char* choices;       // kChoice
  const char* alias_of;      // nullptr, or the key this one is another unit of
  double factor;             // alias value * factor = the key's value
  const char* doc;
};

inline constexpr double kTwo63 = 9223372036854775808.0;  // 2**63

// In the order error messages and the README list them.
inline constexpr Key kConfigKeys[] = {
    {"max_reserved_mb", Type::kUInt, "MiB", "0", 0, 8796093022208.0 /* 2**43 */, nullptr,
     "max_reserved_bytes", 1048576.0,
     "limit on reserved memory in MiB (0: none); the same limit as max_reserved_bytes"},
    {"max_reserved_bytes", Type::kUInt, "bytes", "0", 0, kTwo63, nullptr, nullptr, 1.0,
     "limit on reserved memory (0: none); beyond it the arena frees its cache, retries once, "
     "then raises torch.OutOfMemoryError"},
    {"expandable_segments", Type::kBool, "", "True", 0, 0, nullptr, nullptr, 1.0,
     "one growable segment per stream and pool (address ranges: mmap on the CPU, CUDA VMM on "
     "GPUs)"},
    {"stream_policy", Type::kChoice, "", "defer", 0, 0, "defer|wait", nullptr, 1.0,
     "defer: memory used on another stream waits for that stream's event (like PyTorch); wait: "
     "the allocating stream waits on the device instead (like cudaMallocAsync)"},
    {"planning", Type::kBool, "", "True", 0, 0, nullptr, nullptr, 1.0,
     "record, plan and replay marked steps"},
    {"max_variants", Type::kUInt, "count", "8", 1, 1048576.0, nullptr, nullptr, 1.0,
     "variants (shape sets) kept, least recently used out"},
    {"plan_budget_ms", Type::kUInt, "ms", "250", 0, 3600000.0, nullptr, nullptr, 1.0,
     "planner budget per planner call, in wall time (plans are deterministic unless the clock "
     "stops the search; a step's plan with a bridge or pins makes several calls, above)"},
    {"plan_budget_seconds", Type::kFloat, "s", "0.25", 0, 3600.0, nullptr, "plan_budget_ms",
     1000.0, "the planner budget in seconds; the same budget as plan_budget_ms"},
    {"plan_deterministic", Type::kBool, "", "False", 0, 0, nullptr, nullptr, 1.0,
     "the planner stops at its work count only, never at the wall clock: a recorded step gets "
     "the same plan on every machine and load (a plan then takes as long as that work takes: "
     "about the budget on an idle reference machine, longer on a slower or loaded one)"},
    {"plan_threads", Type::kUInt, "count", "2", 1, 2, nullptr, nullptr, 1.0,
     "CPU threads per planner call: 2 runs a second thread beside the rest (the search's branch "
     "and bound at the lower bound on steps up to 1,500 buffers, the peak-first passes on larger "
     "ones); 1 keeps the call on the thread that makes it"},
    {"range_bytes", Type::kUInt, "bytes", "0", 0, 281474976710656.0 /* 2**48 */, nullptr,
     nullptr, 1.0,
     "address space reserved per expandable segment (0: from the device's memory); rounded up "
     "to the device's granule"},
    {"small_segment", Type::kUInt, "bytes", "2097152", 1048576.0, 1099511627776.0 /* 2**40 */,
     nullptr, nullptr, 1.0,
     "segment size of the small pool (fixed segments); a multiple of the device's alignment"},
    {"large_segment", Type::kUInt, "bytes", "20971520", 10485760.0, 1099511627776.0, nullptr,
     nullptr, 1.0,
     "segment shared by large requests below 10 MiB (fixed segments); a multiple of the "
     "device's alignment"},
};

// A value given for a key; which member counts follows the key's type.
struct Value {
  Type type = Type::kBool;
  bool b = false;
  std::uint64_t u = 0;
  double d = 0.0;
  std::string s;

  static Value of_bool(bool v) { Value x; x.type = Type::kBool; x.b = v; return x; }
  static Value of_uint(std::uint64_t v) { Value x; x.type = Type::kUInt; x.u = v; return x; }
  static Value of_float(double v) { Value x; x.type = Type::kFloat; x.d = v; return x; }
  static Value of_text(std::string v) {
    Value x; x.type = Type::kChoice; x.s = std::move(v); return x;
  }
};

// The key called `name`, or nullptr.
const Key* find_key(std::string_view name);

// Sets `name` in `c` after checking its type and range; a kUInt value is
// accepted for a kFloat key. Throws std::invalid_argument naming the key
// ("arena option 'max_variants' must be an integer in [1, 1048576], got 0").
void set_key(ArenaConfig& c, std::string_view name, const Value& v);

// The value of a key (not an alias) in `c`, as TORCH_RENAISSANCE_CONF would
// write it ("8", "True", "defer", "0.25"): for tests and exports.
std::string get_key(const ArenaConfig& c, std::string_view name);

// Throws std::invalid_argument naming the first field of `c` outside its
// key's range (e.g. an ArenaConfig built in C++ with max_variants = 0).
void validate(const ArenaConfig& c);

}  // namespace config_table
}  // namespace renaissance
