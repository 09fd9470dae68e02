#pragma once
// CurveZMQ key pairs (RFC 26, Curve25519 through libsodium inside libzmq)
// and their files, for `troupe keygen` and the --curve-* flags.
//
// Keys are Z85 text: 40 characters for 32 bytes. Files are small text:
//
//   # troupe CurveZMQ secret key: keep it private (mode 0600)
//   public-key = <40 characters>
//   secret-key = <40 characters>
//
// A public key file holds one `public-key = ...` line; a list of allowed
// keys is such lines (or bare keys), one per line, `#` starting a comment
// line. Secret key files are written with mode 0600 and refused when group
// or others may read them (as ssh refuses a private key).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/socket_options.hpp"

namespace troupe::transport {

struct KeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Whether the linked libzmq was built with CURVE (libsodium).
bool curve_available();
// A fresh key pair. Throws std::runtime_error when CURVE is not available.
KeyPair generate_keypair();
// 40 Z85 characters that decode to 32 bytes.
bool is_z85_key(std::string_view key);
// The public key that belongs to a secret key. Throws std::invalid_argument
// unless `secret_key` is a Z85 key.
std::string public_key_of(std::string_view secret_key);

// Writes a key pair file with mode 0600. Throws std::invalid_argument when
// the file exists (remove it first: keys are not overwritten by accident),
// std::runtime_error when it cannot be written.
void write_secret_key_file(const std::string& path, const KeyPair& keys);
// Writes a public key file (mode 0644); replaces an existing file.
void write_public_key_file(const std::string& path, std::string_view public_key);

// Reads a key pair file. Throws std::runtime_error when it cannot be read,
// is readable by group or others, is not in the format above, or holds a
// public key that does not belong to its secret key.
KeyPair read_secret_key_file(const std::string& path);
// Every public key in a file (a .pub file, a list, or a key pair file: its
// public key), or in every *.pub / *.key file of a folder. Throws
// std::runtime_error naming the file and line of anything else, or when no
// key is found.
std::vector<std::string> read_public_keys(const std::string& path);
// A public key given on the command line: the key itself (40 Z85
// characters) or a file holding exactly one. Throws std::runtime_error.
std::string load_public_key(const std::string& key_or_path);

// A CurveZMQ client's keys from its two flags: its secret key file and the
// server's public key (or its .pub file). Both empty: nullopt (plaintext).
// Throws std::invalid_argument when only one is given (the message names
// both flags), and what the two readers above throw.
std::optional<CurveClientKeys> client_keys(const std::string& secret_key_file, const std::string& server_key);

}  // namespace troupe::transport
