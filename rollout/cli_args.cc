#include "rollout/cli_args.h"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>

#include <CLI/CLI.hpp>

namespace bitroll::rollout {

Status ParseDoubleFlag(const std::string& flag, const std::string& text, double* out) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0') {
    return Status::InvalidArgument(flag + ": '" + text + "' is not a number");
  }
  *out = v;
  return Status::Ok();
}

struct CliParser::Impl {
  struct Entry {
    CLI::Option* option = nullptr;
    std::string raw;  // the value given (the last one when given twice)
    Setter set;
  };

  explicit Impl(const std::string& command, const std::string& description)
      : app(description, "bitroll " + command) {
    app.allow_extras();  // reported by Parse() in the one message style
    app.get_formatter()->column_width(34);
    app.get_formatter()->label("OPTIONS", "FLAGS");
    app.get_help_ptr()->group("Flags");
  }

  // The name of the option CLI11 calls `cli_name` in a message, as the user knows it.
  std::string UserName(const std::string& cli_name) const {
    auto it = names.find(cli_name);
    return it != names.end() ? it->second : cli_name;
  }

  CLI::App app;
  std::deque<Entry> entries;  // declaration order; stable addresses for CLI11's bindings
  std::map<std::string, std::string> names;  // CLI11's option name -> the first declared name
  std::string group = "Flags";
};

CliParser::CliParser(std::string command, std::string description)
    : command_(std::move(command)), impl_(std::make_unique<Impl>(command_, description)) {}

CliParser::~CliParser() = default;

std::string CliParser::FirstName(const std::string& names) {
  return names.substr(0, names.find(','));
}

void CliParser::Group(const std::string& title) {
  impl_->group = title.empty() ? "Flags" : title;
}

void CliParser::Footer(const std::string& text) {
  impl_->app.footer(text);
}

void CliParser::Value(const std::string& names, const std::string& help,
                      const std::string& value_name, Setter set) {
  Impl::Entry& e = impl_->entries.emplace_back();
  e.set = std::move(set);
  e.option = impl_->app.add_option(names, e.raw, help)
                 ->type_name(value_name)
                 ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                 ->group(impl_->group);
  impl_->names[e.option->get_name()] = FirstName(names);
}

void CliParser::String(const std::string& names, std::string* out, const std::string& help,
                       const std::string& value_name) {
  Value(names, help, value_name, [out](const std::string& v) {
    *out = v;
    return Status::Ok();
  });
}

void CliParser::Double(const std::string& names, double* out, const std::string& help,
                       const std::string& value_name) {
  const std::string flag = FirstName(names);
  Value(names, help, value_name,
        [flag, out](const std::string& v) { return ParseDoubleFlag(flag, v, out); });
}

void CliParser::Flag(const std::string& names, bool* out, const std::string& help) {
  CLI::Option* o = impl_->app.add_flag(names, *out, help)
                       ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                       ->group(impl_->group);
  impl_->names[o->get_name()] = FirstName(names);
}

void CliParser::Positional(const std::string& name, std::string* out, const std::string& help) {
  impl_->app.add_option(name, *out, help)->type_name("");
}

Status CliParser::Parse(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(args);
}

Status CliParser::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // what CLI11 takes
  try {
    impl_->app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    help_ = true;
    return Status::Ok();
  } catch (const CLI::ArgumentMismatch& e) {
    const std::string what = e.what();
    const size_t colon = what.find(": ");
    if (colon != std::string::npos && what.size() > 8 &&
        what.compare(what.size() - 8, 8, " missing") == 0) {
      return Status::InvalidArgument(impl_->UserName(what.substr(0, colon)) + " needs a value");
    }
    return Status::InvalidArgument(what);
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(e.what());
  }
  for (const std::string& a : impl_->app.remaining()) {
    if (a.size() > 1 && a[0] == '-') {
      return Status::InvalidArgument("unknown flag " + a.substr(0, a.find('=')));
    }
    return Status::InvalidArgument("unexpected argument '" + a + "'");
  }
  for (Impl::Entry& e : impl_->entries) {
    if (e.option->count() > 0) BR_RETURN_IF_ERROR(e.set(e.raw));
  }
  return Status::Ok();
}

bool CliParser::Given(const std::string& name) const {
  const CLI::Option* o = impl_->app.get_option_no_throw(name);
  return o != nullptr && o->count() > 0;
}

std::string CliParser::HelpText() const {
  return impl_->app.help();
}

int UsageError(const std::string& command, const Status& s) {
  // A bad argument speaks for itself; another error (a config file not found) keeps its code.
  const std::string what = s.code() == ErrorCode::kInvalidArgument ? s.message() : s.ToString();
  std::fprintf(stderr, "bitroll %s: %s\nRun 'bitroll %s --help' for its flags.\n", command.c_str(),
               what.c_str(), command.c_str());
  return 2;
}

int PrintHelp(const CliParser& p) {
  const std::string text = p.HelpText();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace bitroll::rollout
