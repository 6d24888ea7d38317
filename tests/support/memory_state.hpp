// Test support: an in-memory implementation of the state protocol (<dtrain/core/state.hpp>),
// i.e. what a checkpointer does, minus the file. Used to test that objects round-trip exactly.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

/// A state visitor that saves into / loads from maps (what a checkpointer does, minus the file).
struct MemoryState {
  bool load = false;
  std::string prefix;
  std::map<std::string, std::int64_t> ints;
  std::map<std::string, double> reals;
  std::map<std::string, std::string> strings;
  std::map<std::string, std::vector<unsigned char>> tensors;
  std::map<std::string, Shape> shapes;

  bool loading() const { return load; }
  void tensor(const std::string& name, BufferView v, Shape s) {
    const std::string key = prefix + name;
    if (element_count(s) != v.count)
      throw std::runtime_error("shape " + to_string(s) + " does not match the " +
                               std::to_string(v.count) + " elements of " + key);
    if (!load) {
      const auto* p = static_cast<const unsigned char*>(v.data);
      tensors[key].assign(p, p + v.bytes());
      shapes[key] = s;
    } else {
      const auto& src = tensors.at(key);
      if (src.size() != v.bytes() || shapes.at(key) != s)
        throw std::runtime_error("shape mismatch restoring " + key);
      if (!src.empty()) std::memcpy(v.data, src.data(), src.size());
    }
  }
  template <class S>
  void scalar(const std::string& name, S& value) {
    auto& m = table(value);
    const std::string key = prefix + name;
    if (!load)
      m[key] = value;
    else
      value = m.at(key);
  }
  template <class U>
  void child(const std::string& name, U& sub) {
    const std::string saved = prefix;
    prefix += name + "/";
    sub.visit_state(*this);
    prefix = saved;
  }

 private:
  std::map<std::string, std::int64_t>& table(std::int64_t&) { return ints; }
  std::map<std::string, double>& table(double&) { return reals; }
  std::map<std::string, std::string>& table(std::string&) { return strings; }
};

}  // namespace dtrain::test
