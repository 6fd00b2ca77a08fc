#include "launch_options.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <functional>
#include <map>

namespace hyperpar::launcher {
namespace {

[[noreturn]] void usage_error(const std::string& msg) { throw LaunchUsageError(msg); }

std::optional<bool> parse_bool(const std::string& v) {
  if (v == "True" || v == "true" || v == "1") return true;
  if (v == "False" || v == "false" || v == "0") return false;
  return std::nullopt;
}

int parse_int(const std::string& flag, const std::string& v, const char* expected) {
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < INT_MIN || n > INT_MAX)
    usage_error(flag + " must be " + expected + ", got '" + v + "'");
  return static_cast<int>(n);
}

int positive(const std::string& flag, const std::string& v) {
  const int n = parse_int(flag, v, "a positive integer");
  if (n < 1) usage_error(flag + " must be a positive integer, got " + v);
  return n;
}

enum class Kind { kValue, kBool };

// What each flag name means; torchrun's spellings map onto the same fields.
struct Parsed {
  std::optional<int> worker_num, local_worker_num, nproc_per_node, nnodes, node_rank, master_port;
  std::optional<std::string> master_addr, log_dir, backend, worker_shim;
  std::optional<bool> join, standalone;
  std::optional<double> stop_grace_s;
  std::optional<int> max_restarts;
  bool help = false;
};

struct FlagSpec {
  Kind kind;
  std::function<void(Parsed&, const std::string& flag, const std::string& value)> set;
};

const std::map<std::string, FlagSpec>& flag_specs() {
  static const std::map<std::string, FlagSpec> specs = {
      {"worker_num",
       {Kind::kValue, [](Parsed& p, auto& f, auto& v) { p.worker_num = positive(f, v); }}},
      {"local_worker_num",
       {Kind::kValue, [](Parsed& p, auto& f, auto& v) { p.local_worker_num = positive(f, v); }}},
      {"nproc_per_node",
       {Kind::kValue, [](Parsed& p, auto& f, auto& v) { p.nproc_per_node = positive(f, v); }}},
      {"nnodes",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          if (v.find(':') != std::string::npos)
            usage_error(f + " must be a fixed node count, got the elastic range '" + v +
                        "' (hyperpar-run does not resize jobs)");
          p.nnodes = positive(f, v);
        }}},
      {"node_rank",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          p.node_rank = parse_int(f, v, "a node index >= 0");
          if (*p.node_rank < 0) usage_error(f + " must be a node index >= 0, got " + v);
        }}},
      {"master_port",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          p.master_port = parse_int(f, v, "a port number 1..65535");
          if (*p.master_port < 1 || *p.master_port > 65535)
            usage_error(f + " must be 1..65535, got " + v);
        }}},
      {"master_addr",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          if (v.empty()) usage_error(f + " must be a host name or address, got ''");
          p.master_addr = v;
        }}},
      {"log_dir",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          if (v.empty()) usage_error(f + " must be a directory path, got ''");
          p.log_dir = v;
        }}},
      {"backend",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          if (v != "mpi" && v != "gloo") usage_error(f + " must be mpi or gloo, got '" + v + "'");
          p.backend = v;
        }}},
      {"stop_grace_s",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          char* end = nullptr;
          const double s = std::strtod(v.c_str(), &end);
          if (v.empty() || *end != '\0' || !(s > 0) || s > 86400)
            usage_error(f + " must be a number of seconds in (0, 86400], got '" + v + "'");
          p.stop_grace_s = s;
        }}},
      {"max_restarts",
       {Kind::kValue,
        [](Parsed& p, auto& f, auto& v) {
          p.max_restarts = parse_int(f, v, "a count >= 0");
          if (*p.max_restarts < 0) usage_error(f + " must be a count >= 0, got " + v);
        }}},
      {"worker_shim", {Kind::kValue, [](Parsed& p, auto&, auto& v) { p.worker_shim = v; }}},
      {"join", {Kind::kBool, [](Parsed& p, auto&, auto& v) { p.join = v == "1"; }}},
      {"no_join", {Kind::kBool, [](Parsed& p, auto&, auto& v) { p.join = v != "1"; }}},
      {"standalone", {Kind::kBool, [](Parsed& p, auto&, auto& v) { p.standalone = v == "1"; }}},
      {"help", {Kind::kBool, [](Parsed& p, auto&, auto&) { p.help = true; }}},
  };
  return specs;
}

std::string normalise(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace

std::string launch_usage() {
  return "usage: hyperpar-run [flags] PROGRAM [ARGS...]\n"
         "  --worker_num N         workers of the whole job (every node)\n"
         "  --local_worker_num N   workers started by this launcher (default: all)\n"
         "  --node_rank I          this node's index (0-based)\n"
         "  --master_addr HOST     rendezvous host (default 127.0.0.1)\n"
         "  --master_port P        rendezvous port (default 29500)\n"
         "  --log_dir DIR          one log per worker: DIR/worker_R.log (default hyperpar_logs)\n"
         "  --join [BOOL]          wait for the workers (default True); False returns at once\n"
         "  --backend mpi|gloo     default: the config's comm.backend, else mpi\n"
         "  --stop_grace_s S       after forwarding a stop signal, SIGKILL after S s (30)\n"
         "  --max_restarts N       restart the whole job up to N times after a failure (0)\n"
         "torchrun spellings: --nproc_per_node, --nnodes, --node_rank, --master_addr,\n"
         "  --master_port, --standalone, --max-restarts (total workers = nnodes x nproc_per_node)\n"
         "The first argument that is not a flag is the program; everything after it is its own.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  Parsed p;
  std::vector<std::string> command;
  const auto& specs = flag_specs();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      command.assign(args.begin() + i + 1, args.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      command.assign(args.begin() + i, args.end());
      break;
    }
    if (a == "-h") {
      p.help = true;
      continue;
    }
    const size_t dashes = a[1] == '-' ? 2 : 1;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string name = normalise(flag.substr(dashes));
    auto it = specs.find(name);
    if (it == specs.end())
      usage_error("unknown flag " + flag + " (the program comes after the flags; see --help)");
    const FlagSpec& spec = it->second;
    if (spec.kind == Kind::kBool) {
      std::optional<bool> value = true;
      if (eq != std::string::npos) {
        value = parse_bool(a.substr(eq + 1));
        if (!value)
          usage_error(flag + " takes True|true|1|False|false|0, got '" + a.substr(eq + 1) + "'");
      } else if (i + 1 < args.size() && parse_bool(args[i + 1])) {
        value = parse_bool(args[++i]);
      }
      spec.set(p, flag, *value ? "1" : "0");
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) usage_error(flag + " needs a value");
      value = args[++i];
    }
    spec.set(p, flag, value);
  }

  LaunchOptions o;
  o.help = p.help;
  if (p.help) return o;
  if (p.worker_shim) {
    o.worker_shim = *p.worker_shim;
    o.command = command;
    if (o.command.empty()) usage_error("--worker-shim needs a program");
    return o;
  }
  if (command.empty()) usage_error("no program given: hyperpar-run [flags] PROGRAM [ARGS...]");
  o.command = command;

  // Workers per node: msrun's --local_worker_num or torchrun's --nproc_per_node.
  if (p.local_worker_num && p.nproc_per_node && *p.local_worker_num != *p.nproc_per_node)
    usage_error("--local_worker_num " + std::to_string(*p.local_worker_num) +
                " disagrees with --nproc_per_node " + std::to_string(*p.nproc_per_node));
  std::optional<int> local = p.local_worker_num ? p.local_worker_num : p.nproc_per_node;
  if (p.standalone && *p.standalone) {
    if (p.nnodes && *p.nnodes != 1)
      usage_error("--standalone is a single-node job, but --nnodes is " +
                  std::to_string(*p.nnodes));
    if (p.master_addr && *p.master_addr != "127.0.0.1" && *p.master_addr != "localhost")
      usage_error("--standalone rendezvouses on this host, but --master_addr is " + *p.master_addr);
    p.nnodes = 1;
  }
  if (p.nnodes && local) {
    const long long total = static_cast<long long>(*p.nnodes) * *local;
    if (p.worker_num && *p.worker_num != total)
      usage_error("--worker_num " + std::to_string(*p.worker_num) + " disagrees with --nnodes " +
                  std::to_string(*p.nnodes) + " x workers per node " + std::to_string(*local) +
                  " = " + std::to_string(total));
    if (total > INT_MAX) usage_error("--nnodes x --nproc_per_node is too large");
    o.worker_num = static_cast<int>(total);
  } else if (p.worker_num) {
    o.worker_num = *p.worker_num;
    if (p.nnodes) {
      if (*p.worker_num % *p.nnodes)
        usage_error("--worker_num " + std::to_string(*p.worker_num) +
                    " is not divisible by --nnodes " + std::to_string(*p.nnodes));
      local = *p.worker_num / *p.nnodes;
    }
  } else if (local) {
    o.worker_num = *local;  // one node
  }
  o.local_worker_num = local ? *local : o.worker_num;
  if (o.local_worker_num > o.worker_num || o.worker_num % o.local_worker_num)
    usage_error("--local_worker_num " + std::to_string(o.local_worker_num) +
                " must divide --worker_num " + std::to_string(o.worker_num));
  const int nodes = o.worker_num / o.local_worker_num;
  o.node_rank = p.node_rank.value_or(0);
  if (o.node_rank >= nodes)
    usage_error("--node_rank must be below the node count " + std::to_string(nodes) + ", got " +
                std::to_string(o.node_rank));
  if (p.master_addr) o.master_addr = *p.master_addr;
  if (p.master_port) o.master_port = *p.master_port;
  // torchrun --standalone without a port: any free port (0: the launcher picks one).
  else if (p.standalone && *p.standalone)
    o.master_port = 0;
  if (p.log_dir) o.log_dir = *p.log_dir;
  if (p.join) o.join = *p.join;
  if (p.stop_grace_s) o.stop_grace_s = *p.stop_grace_s;
  if (p.max_restarts) o.max_restarts = *p.max_restarts;
  o.backend = p.backend;
  return o;
}

}  // namespace hyperpar::launcher
