// Example 20's samples: a rank's tile of the solver's field (its own rows and the ghost rows either
// side, see heat_solver.hpp) as the surrogate sees it: the CNN takes the scaled tile whole and is
// scored on the own rows only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "heat_solver.hpp"

// A tile as the CNN sees it: (u - mean) / rms over the whole tile; returns the rms.
inline double scale_tile(const std::vector<double>& u, float* x) {
  double m = 0, ss = 0;
  for (double v : u) m += v;
  m /= double(u.size());
  for (double v : u) ss += (v - m) * (v - m);
  const double s = std::max(std::sqrt(ss / double(u.size())), 1e-30);
  for (std::size_t k = 0; k < u.size(); ++k) x[k] = float((u[k] - m) / s);
  return s;
}

// The CNN's loss on `batch` tiles: the mean squared error of `out` against `y` over the rank's own
// rows (the halo rows only feed them). Writes its gradient to dy and returns it.
inline double own_rows_mse(const Grid& g, std::size_t batch, const float* out, const float* y,
                           float* dy) {
  const std::size_t tile = g.cells(), n = batch * std::size_t(g.rows) * g.nx;
  double loss = 0;
  for (std::size_t k = 0; k < batch * tile; ++k) {
    const bool mine = k % tile >= g.at(0, 0) && k % tile < g.at(g.rows, 0);
    const float d = mine ? out[k] - y[k] : 0.0f;
    dy[k] = 2 * d / float(n);
    loss += double(d) * d / double(n);
  }
  return loss;
}
