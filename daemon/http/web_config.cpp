#include "daemon/http/web_config.h"

#include <spdlog/fmt/fmt.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <utility>

namespace tokenmeter::daemon::http {
namespace {

// Relative paths in the file are relative to the file's directory, as
// exporter-toolkit resolves them.
std::string Resolve(const std::string& config_path, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  size_t slash = config_path.rfind('/');
  if (slash == std::string::npos) return path;
  return config_path.substr(0, slash + 1) + path;
}

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return fmt::format(" (line {})", mark.line + 1);
}

// A mapping's keys, each required to be one of `allowed`.
Status CheckKeys(const YAML::Node& map, const std::string& what,
                 std::initializer_list<const char*> allowed) {
  if (!map.IsMap()) {
    return Status::Error(
        fmt::format("{}{}: expected a mapping", what, Where(map)));
  }
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    bool known = false;
    for (const char* name : allowed) known = known || key == name;
    if (!known) {
      return Status::Error(
          fmt::format("{}{}: unknown or unsupported key \"{}\"",
                      what.empty() ? "" : what, Where(entry.first), key));
    }
  }
  return Status::Ok();
}

Status ScalarString(const YAML::Node& node, const std::string& what,
                    std::string* out) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    return Status::Error(
        fmt::format("{}{}: expected a non-empty string", what, Where(node)));
  }
  *out = node.Scalar();
  return Status::Ok();
}

Status Parse(const std::string& path, const YAML::Node& root, WebConfig* out) {
  if (root.IsNull()) return Status::Ok();  // An empty file.
  Status s =
      CheckKeys(root, "top level", {"tls_server_config", "basic_auth_users"});
  if (!s.ok()) return s;
  WebConfig config;
  if (const YAML::Node tls = root["tls_server_config"]; tls && !tls.IsNull()) {
    s = CheckKeys(tls, "tls_server_config", {"cert_file", "key_file"});
    if (!s.ok()) return s;
    std::string cert;
    std::string key;
    if (!tls["cert_file"] || !tls["key_file"]) {
      return Status::Error(
          "tls_server_config: both cert_file and key_file are required");
    }
    s = ScalarString(tls["cert_file"], "tls_server_config.cert_file", &cert);
    if (s.ok()) {
      s = ScalarString(tls["key_file"], "tls_server_config.key_file", &key);
    }
    if (s.ok()) {
      s = TlsContext::Create(Resolve(path, cert), Resolve(path, key),
                             &config.tls);
    }
    if (!s.ok()) return s;
  }
  if (const YAML::Node users = root["basic_auth_users"];
      users && !users.IsNull()) {
    if (!users.IsMap()) {
      return Status::Error(fmt::format(
          "basic_auth_users{}: expected a mapping of user: bcrypt hash",
          Where(users)));
    }
    std::map<std::string, std::string> table;
    for (const auto& entry : users) {
      const std::string user = entry.first.as<std::string>();
      std::string hash;
      s = ScalarString(entry.second, "basic_auth_users." + user, &hash);
      if (!s.ok()) return s;
      table.emplace(user, std::move(hash));
    }
    if (!table.empty()) {
      std::unique_ptr<BasicAuth> auth;
      s = BasicAuth::Create(std::move(table), &auth);
      if (!s.ok()) return s;
      config.basic_auth = std::move(auth);
    }
  }
  *out = std::move(config);
  return Status::Ok();
}

// yaml-cpp reports errors as exceptions: each becomes one line.
Status ParseFile(const std::string& path, WebConfig* out) {
  try {
    return Parse(path, YAML::LoadFile(path), out);
  } catch (const YAML::Exception& e) {
    return Status::Error(fmt::format("YAML error at line {}, column {}: {}",
                                     e.mark.line + 1, e.mark.column + 1,
                                     e.msg));
  } catch (const std::exception& e) {
    return Status::Error(e.what());
  }
}

}  // namespace

Status WebConfig::Load(const std::string& path, WebConfig* out) {
  Status s = Status::Ok();
  if (FILE* f = std::fopen(path.c_str(), "r"); f == nullptr) {
    s = Status::Error(fmt::format("cannot read the file: {}", strerror(errno)));
  } else {
    std::fclose(f);
    s = ParseFile(path, out);
  }
  if (s.ok()) return s;
  return Status::Error(
      fmt::format("--web-config \"{}\": {}", path, s.message()));
}

}  // namespace tokenmeter::daemon::http
