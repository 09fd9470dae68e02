#pragma once
// Small dense least squares for fitting cost models (a few hundred rows, a
// dozen columns): Householder QR, and non-negative least squares by Lawson &
// Hanson's active-set method ("Solving Least Squares Problems", 1974, ch. 23).
#include <vector>

namespace troupe::cluster::sim {

using Matrix = std::vector<std::vector<double>>;  // rows of equal length

// argmin |A x - b|. Columns whose contribution is numerically zero (rank
// deficiency) get x = 0. Throws std::invalid_argument on ragged or mismatched input.
std::vector<double> least_squares(const Matrix& a, const std::vector<double>& b);

// argmin |A x - b| subject to x >= 0.
std::vector<double> nonnegative_least_squares(const Matrix& a, const std::vector<double>& b);

}  // namespace troupe::cluster::sim
