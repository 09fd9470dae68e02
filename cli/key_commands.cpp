// troupe keygen: a CurveZMQ key pair for the cluster's encrypted links.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.hpp"
#include "transport/curve_keys.hpp"

namespace troupe::cli {

void add_key_commands(CLI::App& app, Registry& registry) {
  auto* sub =
      app.add_subcommand("keygen", "Make a CurveZMQ key pair: NAME.key (secret, mode 0600) and NAME.pub");
  auto name = std::make_shared<std::string>();
  sub->add_option("--out", *name, "Path prefix of the two files")->required();
  registry.push_back({sub, [name] {
                        const transport::KeyPair k = transport::generate_keypair();
                        transport::write_secret_key_file(*name + ".key", k);
                        transport::write_public_key_file(*name + ".pub", k.public_key);
                        std::printf("%s.key (secret) and %s.pub: %s\n", name->c_str(), name->c_str(),
                                    k.public_key.c_str());
                        return 0;
                      }});
}

}  // namespace troupe::cli
