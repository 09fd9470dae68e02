#include "cluster/sim/least_squares.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace troupe::cluster::sim {
namespace {

size_t check(const Matrix& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("least squares: A and b have different row counts");
  const size_t n = a.empty() ? 0 : a[0].size();
  for (const auto& row : a)
    if (row.size() != n) throw std::invalid_argument("least squares: rows of A differ in length");
  return n;
}

// Least squares on the columns in `use` (the others' coefficients are 0).
std::vector<double> solve_subset(const Matrix& a, const std::vector<double>& b,
                                 const std::vector<bool>& use) {
  const size_t m = a.size(), n = use.size();
  std::vector<size_t> cols;
  for (size_t j = 0; j < n; ++j)
    if (use[j]) cols.push_back(j);
  const size_t p = cols.size();
  // Column-major copy, each column scaled to unit norm (conditioning).
  std::vector<std::vector<double>> q(p, std::vector<double>(m));
  std::vector<double> scale(p, 1.0);
  for (size_t k = 0; k < p; ++k) {
    double norm = 0;
    for (size_t i = 0; i < m; ++i) {
      q[k][i] = a[i][cols[k]];
      norm += q[k][i] * q[k][i];
    }
    norm = std::sqrt(norm);
    scale[k] = norm > 0 ? norm : 1.0;
    for (double& v : q[k]) v /= scale[k];
  }
  std::vector<double> y = b, diag(p, 0.0);
  for (size_t k = 0; k < p && k < m; ++k) {
    double norm = 0;
    for (size_t i = k; i < m; ++i) norm += q[k][i] * q[k][i];
    norm = std::sqrt(norm);
    if (norm < 1e-12) continue;  // dependent column: left at 0 below
    const double alpha = q[k][k] > 0 ? -norm : norm;
    std::vector<double> v(q[k].begin() + static_cast<ptrdiff_t>(k), q[k].end());
    v[0] -= alpha;
    double vv = 0;
    for (double x : v) vv += x * x;
    if (vv == 0) {
      diag[k] = alpha;
      continue;
    }
    auto reflect = [&](std::vector<double>& col) {
      double dot = 0;
      for (size_t i = k; i < m; ++i) dot += v[i - k] * col[i];
      const double f = 2 * dot / vv;
      for (size_t i = k; i < m; ++i) col[i] -= f * v[i - k];
    };
    for (size_t j = k; j < p; ++j) reflect(q[j]);
    reflect(y);
    diag[k] = q[k][k];
  }
  // Back substitution on R (upper triangle of q, column-major).
  std::vector<double> z(p, 0.0);
  for (size_t kk = std::min(p, m); kk-- > 0;) {
    if (std::fabs(diag[kk]) < 1e-12) continue;
    double s = y[kk];
    for (size_t j = kk + 1; j < p; ++j) s -= q[j][kk] * z[j];
    z[kk] = s / diag[kk];
  }
  std::vector<double> x(n, 0.0);
  for (size_t k = 0; k < p; ++k) x[cols[k]] = z[k] / scale[k];
  return x;
}

std::vector<double> gradient(const Matrix& a, const std::vector<double>& b, const std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<double> w(n, 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    double r = b[i];
    for (size_t j = 0; j < n; ++j) r -= a[i][j] * x[j];
    for (size_t j = 0; j < n; ++j) w[j] += a[i][j] * r;
  }
  return w;
}

}  // namespace

std::vector<double> least_squares(const Matrix& a, const std::vector<double>& b) {
  const size_t n = check(a, b);
  return solve_subset(a, b, std::vector<bool>(n, true));
}

std::vector<double> nonnegative_least_squares(const Matrix& a, const std::vector<double>& b) {
  const size_t n = check(a, b);
  std::vector<double> x(n, 0.0);
  std::vector<bool> passive(n, false);
  double scale = 0;
  for (const auto& row : a)
    for (double v : row) scale = std::max(scale, std::fabs(v));
  double bmax = 0;
  for (double v : b) bmax = std::max(bmax, std::fabs(v));
  const double tol = 1e-12 * std::max(1.0, scale * bmax * static_cast<double>(a.size()));
  for (size_t outer = 0; outer < 3 * n + 3; ++outer) {
    const auto w = gradient(a, b, x);
    size_t t = n;
    for (size_t j = 0; j < n; ++j)
      if (!passive[j] && w[j] > tol && (t == n || w[j] > w[t])) t = j;
    if (t == n) break;
    passive[t] = true;
    for (size_t inner = 0; inner < 3 * n + 3; ++inner) {
      const auto z = solve_subset(a, b, passive);
      bool feasible = true;
      for (size_t j = 0; j < n; ++j)
        if (passive[j] && z[j] <= 0) feasible = false;
      if (feasible) {
        x = z;
        break;
      }
      double alpha = 1;
      for (size_t j = 0; j < n; ++j)
        if (passive[j] && z[j] <= 0) alpha = std::min(alpha, x[j] / (x[j] - z[j]));
      for (size_t j = 0; j < n; ++j) {
        x[j] += alpha * (z[j] - x[j]);
        if (passive[j] && x[j] <= 1e-15 * (1 + std::fabs(z[j]))) {
          passive[j] = false;
          x[j] = 0;
        }
      }
    }
  }
  return x;
}

}  // namespace troupe::cluster::sim
