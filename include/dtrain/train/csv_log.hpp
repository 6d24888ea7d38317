// SPDX-License-Identifier: BSD-3-Clause
// dtrain: CsvLog, a step-keyed CSV file that survives restarts without duplicate rows.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// A CSV file whose first column is the optimizer step (metrics.csv, the per-rank timing files).
/// Opening keeps the rows of an earlier run up to the step a resumed run continues from and drops
/// the later ones (they were written after the checkpoint and will be written again), so a file
/// appended across any number of restarts holds each step at most once, in order. A file with
/// other columns is moved aside to `path`.previous. Local, blocking file I/O; not thread-safe.
/// Values are numbers; NaN writes an empty field (a column not measured at that step).
class CsvLog {
 public:
  CsvLog() = default;
  /// `keep_through_step`: rows with a step <= this are kept; -1 (a fresh run) keeps none.
  CsvLog(const std::string& path, std::vector<std::string> columns, std::int64_t keep_through_step)
      : path_(path), columns_(std::move(columns)) {
    const char* op = "CsvLog";
    DTRAIN_REQUIRE(!columns_.empty(), op, "a CSV log needs at least the step column");
    std::string header;
    for (std::size_t i = 0; i < columns_.size(); ++i) header += (i ? "," : "") + columns_[i];
    std::vector<std::string> kept;
    {
      std::ifstream in(path_);
      std::string line;
      if (in && std::getline(in, line)) {
        if (line != header) {
          in.close();
          std::rename(path_.c_str(), (path_ + ".previous").c_str());
        } else {
          while (std::getline(in, line)) {
            if (line.empty()) continue;
            char* end = nullptr;
            const long long step = std::strtoll(line.c_str(), &end, 10);
            if (end == line.c_str() || (*end != ',' && *end != '\0')) continue;  // torn line
            if (step <= keep_through_step) kept.push_back(line);
          }
        }
      }
    }
    // Rewrite what is kept through a temporary file, then append to it.
    const std::string tmp = path_ + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) raise<IoError>(op, "cannot create '" + tmp + "': " + std::strerror(errno));
    std::fprintf(f, "%s\n", header.c_str());
    for (const auto& l : kept) std::fprintf(f, "%s\n", l.c_str());
    if (std::fclose(f) != 0 || std::rename(tmp.c_str(), path_.c_str()) != 0)
      raise<IoError>(op, "cannot write '" + path_ + "': " + std::strerror(errno));
    file_ = std::fopen(path_.c_str(), "a");
    if (!file_) raise<IoError>(op, "cannot append to '" + path_ + "': " + std::strerror(errno));
    kept_rows_ = kept.size();
  }
  ~CsvLog() {
    if (file_) std::fclose(file_);
  }
  CsvLog(CsvLog&& o) noexcept { *this = std::move(o); }
  CsvLog& operator=(CsvLog&& o) noexcept {
    if (this != &o) {
      if (file_) std::fclose(file_);
      path_ = std::move(o.path_);
      columns_ = std::move(o.columns_);
      file_ = o.file_;
      kept_rows_ = o.kept_rows_;
      o.file_ = nullptr;
    }
    return *this;
  }
  CsvLog(const CsvLog&) = delete;
  CsvLog& operator=(const CsvLog&) = delete;

  bool is_open() const noexcept { return file_ != nullptr; }
  const std::string& path() const noexcept { return path_; }
  /// Rows kept from an earlier run when the file was opened.
  std::size_t kept_rows() const noexcept { return kept_rows_; }

  /// Appends one row (one value per column, the step first) and flushes it, so the file is
  /// current if the job dies. Throws InvalidArgument on a wrong value count, IoError naming the
  /// file and errno when the row cannot be written (disk full, file size limit): a lost row is
  /// never silent.
  void row(const std::vector<double>& values) {
    DTRAIN_REQUIRE(values.size() == columns_.size(), "CsvLog::row",
                   "'" << path_ << "' has " << columns_.size() << " columns, got " << values.size()
                       << " values");
    if (!file_) return;
    std::string line;
    char b[40];
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i) line += ',';
      if (std::isnan(values[i])) continue;
      std::snprintf(b, sizeof b, "%.9g", values[i]);
      line += b;
    }
    line += '\n';
    if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
      const int err = errno;
      std::clearerr(file_);
      raise<IoError>("CsvLog::row", "cannot append step " + line.substr(0, line.find(',')) +
                                        " to '" + path_ + "': " + std::strerror(err));
    }
  }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  FILE* file_ = nullptr;
  std::size_t kept_rows_ = 0;
};

}  // namespace dtrain
