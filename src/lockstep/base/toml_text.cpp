// toml_text (toml_text.h).
#include "lockstep/base/toml_text.h"

#include <cctype>
#include <sstream>

#include "lockstep/base/number_text.h"

namespace lockstep {
namespace {

std::string key_text(const std::string& key) {
  bool bare = !key.empty();
  for (char c : key) bare = bare && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  if (bare) return key;
  std::ostringstream os;
  os << toml::value<std::string>(key);  // quoted and escaped as TOML
  return os.str();
}

// A float as TOML: shortest round-trip digits, with ".0" when they read as an integer.
std::string float_text(double v) {
  std::string s = shortest(v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf, nan
  return s;
}

void write_value(std::ostream& os, const toml::node& n);

void write_inline_table(std::ostream& os, const toml::table& t) {
  os << "{";
  bool first = true;
  for (const auto& [k, v] : t) {
    os << (first ? " " : ", ") << key_text(std::string(k.str())) << " = ";
    write_value(os, v);
    first = false;
  }
  os << (first ? "}" : " }");
}

void write_value(std::ostream& os, const toml::node& n) {
  if (const auto* d = n.as_floating_point()) {
    os << float_text(d->get());
  } else if (const auto* a = n.as_array()) {
    os << "[";
    for (size_t i = 0; i < a->size(); ++i) {
      if (i) os << ", ";
      write_value(os, *a->get(i));
    }
    os << "]";
  } else if (const auto* t = n.as_table()) {
    write_inline_table(os, *t);
  } else {
    n.visit([&](const auto& v) { os << v; });  // strings, integers, booleans, dates: toml++'s form
  }
}

void write_table(std::ostream& os, const toml::table& t, const std::string& prefix) {
  for (const auto& [k, v] : t) {
    if (v.is_table()) continue;
    os << key_text(std::string(k.str())) << " = ";
    write_value(os, v);
    os << "\n";
  }
  for (const auto& [k, v] : t) {
    if (!v.is_table()) continue;
    const std::string name = (prefix.empty() ? "" : prefix + ".") + key_text(std::string(k.str()));
    os << "\n[" << name << "]\n";
    write_table(os, *v.as_table(), name);
  }
}

}  // namespace

std::string toml_text(const toml::table& root) {
  std::ostringstream os;
  write_table(os, root, "");
  std::string s = os.str();
  if (!s.empty() && s.front() == '\n') s.erase(0, 1);  // no blank line before the first section
  return s;
}

}  // namespace lockstep
