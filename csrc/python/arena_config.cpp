// arena_config.cpp - Python keyword arguments -> ArenaConfig through the
// key table of core/config.h (see arena_config.h).
#include "python/arena_config.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace renaissance {
namespace {

const char* type_name(config_table::Type t) {
  switch (t) {
    case config_table::Type::kBool: return "bool";
    case config_table::Type::kUInt: return "int";
    case config_table::Type::kFloat: return "float";
    case config_table::Type::kChoice: return "choice";
  }
  return "?";
}

config_table::Value value_of(const config_table::Key& k, py::handle v) {
  const std::string key = k.name;
  const bool is_bool = py::isinstance<py::bool_>(v);
  switch (k.type) {
    case config_table::Type::kBool:
      if (!is_bool) throw py::value_error("arena option '" + key + "' must be a bool");
      return config_table::Value::of_bool(v.cast<bool>());
    case config_table::Type::kUInt:
      if (!py::isinstance<py::int_>(v) || is_bool) {
        throw py::value_error("arena option '" + key + "' must be an int");
      }
      try {
        return config_table::Value::of_uint(v.cast<std::uint64_t>());
      } catch (const py::cast_error&) {  // negative or past 2**64 - 1
        throw py::value_error("arena option '" + key + "' is out of range: " +
                              py::str(v).cast<std::string>());
      }
    case config_table::Type::kFloat:
      if ((!py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v)) || is_bool) {
        throw py::value_error("arena option '" + key + "' must be a float");
      }
      try {
        return config_table::Value::of_float(v.cast<double>());
      } catch (const py::cast_error&) {  // an int past a double's range (10**400)
        throw py::value_error("arena option '" + key + "' is out of range");
      }
    case config_table::Type::kChoice:
      if (!py::isinstance<py::str>(v)) {
        throw py::value_error("arena option '" + key + "' must be a str");
      }
      return config_table::Value::of_text(v.cast<std::string>());
  }
  throw py::value_error("arena option '" + key + "' has an unknown type");
}

}  // namespace

ArenaConfig arena_config_from_kwargs(const py::kwargs& kw) {
  ArenaConfig c;
  for (auto item : kw) {
    const std::string name = py::cast<std::string>(item.first);
    const config_table::Key* k = config_table::find_key(name);
    if (!k) throw py::value_error("unknown arena option '" + name + "'");
    if (k->alias_of && kw.contains(k->alias_of)) {
      throw py::value_error("arena options '" + name + "' and '" + k->alias_of +
                            "' are the same limit in two units; give one");
    }
    config_table::set_key(c, name, value_of(*k, item.second));  // std::invalid_argument -> ValueError
  }
  return c;
}

void bind_config(py::module_& m) {
  m.def("config_keys", [] {
    py::list out;
    for (const config_table::Key& k : config_table::kConfigKeys) {
      py::dict d;
      d["name"] = k.name;
      d["type"] = type_name(k.type);
      d["unit"] = k.unit;
      d["default"] = k.default_text;
      d["min"] = k.min;
      d["max"] = k.max;
      d["choices"] = k.choices ? py::cast(std::string(k.choices)) : py::none();
      d["alias_of"] = k.alias_of ? py::cast(std::string(k.alias_of)) : py::none();
      d["factor"] = k.factor;
      d["doc"] = k.doc;
      out.append(d);
    }
    return out;
  }, "The arena's configuration keys (core/config.h), in order: list of dicts with name, "
     "type ('bool', 'int', 'float', 'choice'), unit, default (text), min, max (inclusive), "
     "choices ('a|b' or None), alias_of (None or the key it is another unit of), factor "
     "(alias value * factor = key value) and doc.");
  m.def("default_arena_config", [] {
    py::dict d;
    const ArenaConfig c;
    for (const config_table::Key& k : config_table::kConfigKeys) {
      if (!k.alias_of) d[k.name] = config_table::get_key(c, k.name);
    }
    return d;
  }, "ArenaConfig{}'s value of every key that is not an alias, as text (for tests).");
  m.def("arena_config_of", [](const py::kwargs& kw) {
    py::dict d;
    const ArenaConfig c = arena_config_from_kwargs(kw);
    config_table::validate(c);
    for (const config_table::Key& k : config_table::kConfigKeys) {
      if (!k.alias_of) d[k.name] = config_table::get_key(c, k.name);
    }
    return d;
  }, "The ArenaConfig that these keyword arguments make, every key as text; raises "
     "ValueError as Arena(...) does (for tests of the binding layer).");
}

}  // namespace renaissance
