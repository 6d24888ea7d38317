// dtrain: plot_metrics, a PNG of a CsvLog's columns drawn by gnuplot when it is installed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// True when a `gnuplot` executable is on PATH.
inline bool gnuplot_available() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

/// Draws the columns `left` (left axis) and `right` (right axis, e.g. accuracies in [0, 1]) of the
/// CSV file `csv` against its "step" column into `png` with gnuplot (Debian: gnuplot-nox), through
/// a script written beside it (`png`.gp, kept for re-plotting); columns without any value are left
/// out. Returns false, without error, when gnuplot is not installed or nothing can be drawn; throws
/// IoError when the script cannot be written or gnuplot fails. Local, blocking (runs a child
/// process); not thread-safe (std::system).
inline bool plot_metrics(const std::string& csv, const std::string& png, const std::string& title,
                         const std::vector<std::string>& left,
                         const std::vector<std::string>& right) {
  const char* op = "plot_metrics";
  if (!gnuplot_available()) return false;
  // gnuplot stops on a column without a single value; plot only the columns that have one.
  std::vector<std::string> header;
  std::vector<bool> has_value;
  {
    std::ifstream in(csv);
    std::string line, cell;
    if (!std::getline(in, line)) return false;
    std::stringstream hs(line);
    while (std::getline(hs, cell, ',')) header.push_back(cell);
    has_value.assign(header.size(), false);
    while (std::getline(in, line)) {
      std::stringstream rs(line);
      for (std::size_t i = 0; i < header.size() && std::getline(rs, cell, ','); ++i)
        if (!cell.empty()) has_value[i] = true;
    }
  }
  auto present = [&](const std::string& c) {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == c) return static_cast<bool>(has_value[i]);
    return false;
  };
  const std::string script = png + ".gp";
  FILE* f = std::fopen(script.c_str(), "w");
  if (!f) raise<IoError>(op, "cannot write '" + script + "'");
  std::string plots;
  auto add = [&](const std::string& col, bool right_axis, bool points) {
    if (!plots.empty()) plots += ", \\\n     ";
    plots += "'" + csv + "' using (column(\"step\")):(column(\"" + col + "\")) with " +
             (points ? "linespoints pt 7 ps 0.6" : "lines") + " lw 1.5 title '" + col + "'" +
             (right_axis ? " axes x1y2" : "");
  };
  for (const auto& c : left)
    if (present(c)) add(c, false, false);
  for (const auto& c : right)
    if (present(c)) add(c, true, true);
  if (plots.empty()) {
    std::fclose(f);
    std::remove(script.c_str());
    return false;
  }
  std::fprintf(f,
               "set terminal pngcairo size 1000,600 noenhanced\n"
               "set output '%s'\n"
               "set datafile separator ','\n"
               "set key autotitle columnhead\n"
               "set title '%s'\n"
               "set xlabel 'step'\n"
               "set ylabel '%s'\n"
               "set y2label '%s'\n"
               "set ytics nomirror\n"
               "set y2tics\n"
               "set grid\n"
               "plot %s\n",
               png.c_str(), title.c_str(), left.empty() ? "" : left.front().c_str(),
               right.empty() ? "" : "accuracy", plots.c_str());
  std::fclose(f);
  const std::string cmd = "gnuplot '" + script + "' 2>'" + png + ".log'";
  if (std::system(cmd.c_str()) != 0)
    raise<IoError>(op, "gnuplot failed on '" + script + "' (see '" + png + ".log')");
  std::remove((png + ".log").c_str());
  return true;
}

}  // namespace dtrain
