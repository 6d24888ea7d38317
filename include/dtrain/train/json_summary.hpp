// SPDX-License-Identifier: BSD-3-Clause
// dtrain: JsonSummary, a flat JSON object of a run's results, written atomically.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// A flat JSON object (string keys; number, integer, boolean or string values, in insertion
/// order), e.g. the --json-summary of a training run. Local value type; not thread-safe.
/// Non-finite numbers are written as null (JSON has no NaN).
class JsonSummary {
 public:
  JsonSummary& add(const std::string& key, double v) {
    char b[64];
    if (std::isfinite(v))
      std::snprintf(b, sizeof b, "%.17g", v);
    else
      std::snprintf(b, sizeof b, "null");
    return put(key, b);
  }
  JsonSummary& add(const std::string& key, std::int64_t v) { return put(key, std::to_string(v)); }
  JsonSummary& add(const std::string& key, int v) { return put(key, std::to_string(v)); }
  JsonSummary& add(const std::string& key, bool v) { return put(key, v ? "true" : "false"); }
  JsonSummary& add(const std::string& key, const std::string& v) { return put(key, quote(v)); }
  JsonSummary& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  /// Adds an already formatted JSON value (an array or nested object).
  JsonSummary& add_raw(const std::string& key, const std::string& json) { return put(key, json); }

  /// The object as text, one key per line.
  std::string str() const {
    std::string s = "{\n";
    for (std::size_t i = 0; i < items_.size(); ++i)
      s += "  " + quote(items_[i].first) + ": " + items_[i].second +
           (i + 1 < items_.size() ? ",\n" : "\n");
    return s + "}\n";
  }

  /// Writes the object to `path` through `path`.tmp and a rename, so a reader never sees half a
  /// file. Local, blocking; throws IoError naming the file.
  void write(const std::string& path) const {
    const char* op = "JsonSummary::write";
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) raise<IoError>(op, "cannot create '" + tmp + "': " + std::strerror(errno));
    const std::string s = str();
    const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
    const bool closed = std::fclose(f) == 0;
    if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp.c_str());
      raise<IoError>(op, "cannot write '" + path + "': " + std::strerror(err));
    }
  }

  /// JSON string literal of `s`.
  static std::string quote(const std::string& s) {
    std::string o = "\"";
    for (const char c : s) {
      switch (c) {
        case '"': o += "\\\""; break;
        case '\\': o += "\\\\"; break;
        case '\n': o += "\\n"; break;
        case '\t': o += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
          } else {
            o += c;
          }
      }
    }
    return o + "\"";
  }

 private:
  JsonSummary& put(const std::string& key, std::string value) {
    for (auto& kv : items_)
      if (kv.first == key) {
        kv.second = std::move(value);
        return *this;
      }
    items_.emplace_back(key, std::move(value));
    return *this;
  }
  std::vector<std::pair<std::string, std::string>> items_;
};

}  // namespace dtrain
