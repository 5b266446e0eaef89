#include "pgtmp/pgtmp.h"

#include "common/clock.h"
#include "common/error.h"
#include "pgtmp/cleanup.h"
#include "pgtmp/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace tierlab::pgtmp {
namespace {

const char* const kSuperuser = "postgres";
const char* const kHost = "127.0.0.1";

bool has_server_programs(const std::string& dir) {
  return !dir.empty() && access((dir + "/postgres").c_str(), X_OK) == 0 &&
         access((dir + "/initdb").c_str(), X_OK) == 0;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// A libpq conninfo value, quoted when it needs to be.
std::string conn_value(const std::string& v) {
  if (!v.empty() && v.find_first_of(" '\\") == std::string::npos) return v;
  std::string q = "'";
  for (char c : v) {
    if (c == '\'' || c == '\\') q += '\\';
    q += c;
  }
  return q + "'";
}

// A postgresql.conf value, always quoted.
std::string conf_value(const std::string& v) {
  std::string q = "'";
  for (char c : v) {
    if (c == '\'') q += '\'';
    q += c;
  }
  return q + "'";
}

std::string tail_lines(const std::string& path, size_t n) {
  std::ifstream in(path);
  if (!in) return "(no server log at " + path + ")";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : " | ") + l;
  return out.empty() ? "(server log is empty)" : out;
}

std::string file_contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string find_bindir() {
  std::string from_pg_config;
  if (FILE* p = popen("pg_config --bindir 2>/dev/null", "r")) {
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) from_pg_config += buf;
    pclose(p);
    from_pg_config = trim(from_pg_config);
  }
  // Debian's pg_config may belong to the client package and name /usr/bin.
  if (has_server_programs(from_pg_config)) return from_pg_config;
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    long version = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str()) continue;
    const std::string bin = entry.path().string() + "/bin";
    if (has_server_programs(bin) && version > best_version) {
      best_version = static_cast<int>(version);
      best = bin;
    }
  }
  if (!best.empty()) return best;
  throw RuntimeError("pgtmp: PostgreSQL server programs (postgres, initdb) not found: `pg_config --bindir` gave '" +
                     from_pg_config + "' and /usr/lib/postgresql/*/bin has none (install postgresql-15)");
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RuntimeError(errno_message("pgtmp: socket", errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    close(fd);
    throw RuntimeError(errno_message("pgtmp: finding a free port on 127.0.0.1", e));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

struct Server::Impl {
  Options opts;
  std::string bindir;
  std::string temp_dir;    // everything lives here; removed at the end
  std::string data_dir;    // temp_dir/data
  std::string socket_dir;  // temp_dir itself (short, for the 107-byte socket path limit)
  std::string log_path;    // temp_dir/server.log
  std::string host = kHost;
  std::string superuser = kSuperuser;
  int port = 0;
  bool port_chosen = false;  // picked by us: may pick another if taken
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  pid_t postmaster = 0;
  pid_t owner = getpid();  // a forked child must not stop its parent's server
  int slot = -1;

  std::vector<std::string> server_env() const {
    // PG* variables would change what the server programs do; the C locale
    // keeps initdb independent of the host's installed locales.
    return detail::environment({"PG", "LC_", "LANG="}, {"LC_ALL=C"});
  }

  detail::SpawnSpec as_server_user(std::vector<std::string> argv) const {
    detail::SpawnSpec s;
    s.argv = std::move(argv);
    s.env = server_env();
    s.uid = uid;
    s.gid = gid;
    s.cwd = temp_dir;
    return s;
  }

  void make_temp_dir() {
    std::string tmpl = tmp_parent() + "/tierlab-pg.XXXXXX";
    if (!mkdtemp(tmpl.data())) throw RuntimeError(errno_message("pgtmp: mkdtemp " + tmpl, errno));
    temp_dir = tmpl;
    slot = detail::register_server(temp_dir);
    data_dir = temp_dir + "/data";
    socket_dir = temp_dir;
    log_path = temp_dir + "/server.log";
    if (uid != static_cast<uid_t>(-1) && chown(temp_dir.c_str(), uid, gid) != 0)
      throw RuntimeError(errno_message("pgtmp: chown " + temp_dir + " to " + opts.run_as, errno));
    if (uid != static_cast<uid_t>(-1)) check_reachable(fs::path(temp_dir).parent_path());
  }

  // The server user must be able to search every directory above its temp
  // dir (TMPDIR under /root is not): say so instead of a bare EACCES later.
  void check_reachable(fs::path dir) const {
    for (; !dir.empty(); dir = dir.parent_path()) {
      struct stat st {};
      if (stat(dir.c_str(), &st) != 0) return;
      const bool ok = (st.st_mode & S_IXOTH) || (st.st_uid == uid && (st.st_mode & S_IXUSR)) ||
                      (st.st_gid == gid && (st.st_mode & S_IXGRP));
      if (!ok)
        throw RuntimeError("pgtmp: user " + opts.run_as + " cannot reach " + temp_dir + " (" + dir.string() +
                           " is not searchable by it); set TMPDIR to a directory it can reach, such as /tmp");
      if (dir == dir.root_path()) return;
    }
  }

  void initdb() {
    std::string cache, key;
    if (opts.reuse_initdb) {
      cache = template_cache();
      key = template_key();
      const std::string tpl = cache + "/" + key + "/data";
      if (!cache.empty() && !key.empty() && fs::exists(tpl + "/PG_VERSION") && copy_tree(tpl, data_dir, true))
        return;
    }
    std::string out;
    int rc = detail::run_capture(
        as_server_user({bindir + "/initdb", "-D", data_dir, "-A", "trust", "-U", superuser, "-E", "UTF8",
                        "--no-locale", "--no-sync"}),
        &out);
    if (rc != 0) throw RuntimeError("pgtmp: initdb failed (status " + std::to_string(rc) + "): " + trim(out));
    if (!cache.empty() && !key.empty()) publish_template(cache, key);
  }

  // $TMPDIR/tierlab-pg-cache-<euid>, private to this user; "" when it cannot
  // be trusted (not ours, not private, a symlink) or created.
  std::string template_cache() const {
    std::string dir = tmp_parent() + "/tierlab-pg-cache-" + std::to_string(geteuid());
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "";
    struct stat st {};
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
      return "";
    return dir;
  }

  // Names what an initdb result depends on: the server build and its owner.
  std::string template_key() const {
    struct stat st {};
    if (stat((bindir + "/postgres").c_str(), &st) != 0) return "";
    const std::string id = bindir + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "|" +
                           std::to_string(uid) + "|" + superuser + "|UTF8|C|v1";
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(id));
    return hex;
  }

  // Copies a data dir, owned by the server user, mode 0700 at the top.
  // False (and nothing left at `to`) on any error.
  bool copy_tree(const std::string& from, const std::string& to, bool chown_to_server) const {
    std::error_code ec;
    fs::copy(from, to, fs::copy_options::recursive, ec);
    if (!ec && chown_to_server && uid != static_cast<uid_t>(-1)) {
      if (lchown(to.c_str(), uid, gid) != 0) ec = std::error_code(errno, std::generic_category());
      for (auto it = fs::recursive_directory_iterator(to, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (lchown(it->path().c_str(), uid, gid) != 0) ec = std::error_code(errno, std::generic_category());
    }
    if (!ec && chmod(to.c_str(), 0700) != 0) ec = std::error_code(errno, std::generic_category());
    if (ec) {
      std::error_code ignored;
      fs::remove_all(to, ignored);
      return false;
    }
    return true;
  }

  // Keeps a copy of a fresh initdb result for the next server. Several
  // processes may race: each copies privately, the first rename wins.
  void publish_template(const std::string& cache, const std::string& key) const {
    std::string tmp = cache + "/new.XXXXXX";
    if (!mkdtemp(tmp.data())) return;
    std::error_code ec;
    if (!copy_tree(data_dir, tmp + "/data", false) || rename(tmp.c_str(), (cache + "/" + key).c_str()) != 0)
      fs::remove_all(tmp, ec);
  }

  std::string tmp_parent() const {
    if (!opts.tmp_parent.empty()) return opts.tmp_parent;
    const char* t = std::getenv("TMPDIR");
    return (t && *t) ? t : "/tmp";
  }

  // Checks what can be checked before any work is done.
  void validate() const {
    static const char* const kMethods[] = {"trust", "scram-sha-256", "md5", "password", "reject"};
    if (std::find_if(std::begin(kMethods), std::end(kMethods),
                     [&](const char* m) { return opts.host_auth == m; }) == std::end(kMethods))
      throw InputError("pgtmp: host_auth '" + opts.host_auth +
                       "' is not one of trust, scram-sha-256, md5, password, reject");
    for (const auto& setting : opts.settings) {
      const std::string& name = setting.first;
      if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") !=
                              std::string::npos)
        throw InputError("pgtmp: bad setting name '" + name + "'");
    }
  }

  void configure() {
    {
      // Rewritten in place so the file keeps its owner.
      std::ofstream hba(data_dir + "/pg_hba.conf", std::ios::trunc);
      hba << "# written by tierlab pgtmp\n"
          << "local all all trust\n"
          << "host all all 127.0.0.1/32 " << opts.host_auth << "\n"
          << "host all all ::1/128 " << opts.host_auth << "\n"
          << "local replication all trust\n"
          << "host replication all 127.0.0.1/32 " << opts.host_auth << "\n";
      if (!hba) throw RuntimeError("pgtmp: cannot write " + data_dir + "/pg_hba.conf");
    }
    std::ofstream conf(data_dir + "/postgresql.conf", std::ios::app);
    // Defaults: many connections (replay opens 2,000+ sessions), small
    // memory, log to a file. Durability (fsync, synchronous_commit) stays the
    // server's default, on: a tool about storage must not hide the storage.
    // Callers that want speed over durability set fsync=off themselves.
    // Caller settings come after and win.
    conf << "\n# tierlab pgtmp defaults\n"
         << "listen_addresses = '127.0.0.1'\n"
         << "unix_socket_directories = " << conf_value(socket_dir) << "\n"
         << "max_connections = 2500\n"
         << "shared_buffers = 32MB\n"
         << "logging_collector = off\n"
         << "log_line_prefix = '%m [%p] '\n";
    if (!opts.settings.empty()) conf << "# tierlab pgtmp caller settings\n";
    for (const auto& [name, value] : opts.settings) {
      conf << name << " = " << conf_value(value) << "\n";
    }
    if (!conf) throw RuntimeError("pgtmp: cannot write " + data_dir + "/postgresql.conf");
  }

  // Starts the postmaster and waits until it accepts connections.
  void start_postmaster() {
    for (int attempt = 0;; ++attempt) {
      const std::string failure = try_start();
      if (failure.empty()) return;
      // A port we picked may have been taken in the meantime: pick another.
      const bool port_taken = failure.find("Address already in use") != std::string::npos;
      if (port_taken && port_chosen && attempt < 5) {
        port = free_port();
        continue;
      }
      throw RuntimeError(failure);
    }
  }

  // Returns "" on success, otherwise the error message.
  std::string try_start() {
    const auto log_start = fs::exists(log_path) ? fs::file_size(log_path) : 0;
    int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0) throw RuntimeError(errno_message("pgtmp: open " + log_path, errno));
    if (uid != static_cast<uid_t>(-1) && fchown(log_fd, uid, gid) != 0) {
      int e = errno;
      close(log_fd);
      throw RuntimeError(errno_message("pgtmp: chown " + log_path, e));
    }
    std::vector<std::string> argv = opts.exec_prefix;
    argv.push_back(bindir + "/postgres");
    for (const char* a : {"-D", data_dir.c_str(), "-p"}) argv.push_back(a);
    argv.push_back(std::to_string(port));
    // An exec_prefix runs as the server user too and must exec the command
    // (keep the pid), so that signals and the parent-death signal reach postgres.
    detail::SpawnSpec spec = as_server_user(argv);
    spec.stdout_fd = log_fd;
    spec.stderr_fd = log_fd;
    spec.die_with_parent = true;
    spec.new_process_group = true;  // a terminal's Ctrl-C reaches us, and we stop it
    pid_t pid;
    try {
      pid = detail::spawn(spec);
    } catch (...) {
      close(log_fd);
      throw;
    }
    close(log_fd);
    postmaster = pid;
    detail::set_postmaster(slot, pid);

    const std::string ping = "host=" + conn_value(socket_dir) + " port=" + std::to_string(port) +
                             " user=" + superuser + " dbname=postgres connect_timeout=2";
    const Nanos deadline = now_ns() + Nanos{opts.start_timeout_s} * 1'000'000'000;
    for (;;) {
      if (PQping(ping.c_str()) == PQPING_OK) return "";
      int st = 0;
      if (detail::wait_for(pid, 0, &st)) {
        postmaster = 0;
        detail::set_postmaster(slot, 0);
        std::string log = file_contents(log_path).substr(log_start);
        return "pgtmp: postgres exited during startup (status " + std::to_string(detail::shell_status(st)) +
               "); server log: " + tail_from(log);
      }
      if (now_ns() >= deadline) {
        kill_postmaster(true, 5000);
        return "pgtmp: postgres did not accept connections within " + std::to_string(opts.start_timeout_s) +
               " s; server log: " + tail_lines(log_path, 15);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static std::string tail_from(const std::string& log) {
    std::deque<std::string> lines;
    std::istringstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      lines.push_back(line);
      if (lines.size() > 15) lines.pop_front();
    }
    std::string out;
    for (const auto& l : lines) out += (out.empty() ? "" : " | ") + l;
    return out.empty() ? "(empty)" : out;
  }

  // Signals the postmaster and waits; SIGKILL after `timeout_ms`.
  void kill_postmaster(bool immediate, int timeout_ms) {
    if (postmaster <= 0) return;
    kill(postmaster, immediate ? SIGQUIT : SIGINT);
    int st;
    if (!detail::wait_for(postmaster, timeout_ms, &st)) {
      kill(postmaster, SIGKILL);
      detail::wait_for(postmaster, -1, &st);
    }
    postmaster = 0;
    detail::set_postmaster(slot, 0);
  }
};

Server::Server(Options opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  m.validate();
  m.bindir = m.opts.bindir.empty() ? find_bindir() : m.opts.bindir;
  if (!has_server_programs(m.bindir))
    throw RuntimeError("pgtmp: " + m.bindir + " has no postgres and initdb programs");
  if (geteuid() == 0) {
    errno = 0;
    const passwd* pw = getpwnam(m.opts.run_as.c_str());
    if (!pw)
      throw RuntimeError("pgtmp: running as root, and the user '" + m.opts.run_as +
                         "' to run PostgreSQL as does not exist (create it, or set run_as)");
    if (pw->pw_uid == 0) throw RuntimeError("pgtmp: run_as user '" + m.opts.run_as + "' is root; PostgreSQL refuses that");
    m.uid = pw->pw_uid;
    m.gid = pw->pw_gid;
  }
  m.port = m.opts.port;
  if (m.port == 0) {
    m.port = free_port();
    m.port_chosen = true;
  }
  try {
    m.make_temp_dir();
    m.initdb();
    m.configure();
    m.start_postmaster();
  } catch (...) {
    m.kill_postmaster(true, 5000);
    if (m.slot >= 0) detail::unregister_server(m.slot);
    std::error_code ec;
    if (!m.temp_dir.empty()) fs::remove_all(m.temp_dir, ec);
    throw;
  }
}

Server::~Server() {
  Impl& m = *impl_;
  if (m.owner != getpid()) return;  // a forked copy: the server belongs to the parent
  try {
    m.kill_postmaster(/*immediate=*/true, 30000);  // the data is thrown away: no checkpoint
  } catch (...) {
  }
  detail::unregister_server(m.slot);
  std::error_code ec;
  fs::remove_all(m.temp_dir, ec);
}

int Server::port() const { return impl_->port; }
const std::string& Server::host() const { return impl_->host; }
const std::string& Server::socket_dir() const { return impl_->socket_dir; }
const std::string& Server::data_dir() const { return impl_->data_dir; }
const std::string& Server::bindir() const { return impl_->bindir; }
const std::string& Server::superuser() const { return impl_->superuser; }
int Server::postmaster_pid() const { return impl_->postmaster; }
const std::string& Server::temp_dir() const { return impl_->temp_dir; }
const std::string& Server::log_path() const { return impl_->log_path; }

std::string Server::conninfo(const std::string& dbname) const {
  return "host=" + impl_->host + " port=" + std::to_string(impl_->port) + " dbname=" + conn_value(dbname) +
         " user=" + impl_->superuser;
}

std::string Server::conninfo_unix(const std::string& dbname) const {
  return "host=" + conn_value(impl_->socket_dir) + " port=" + std::to_string(impl_->port) +
         " dbname=" + conn_value(dbname) + " user=" + impl_->superuser;
}

std::string Server::sql(const std::string& query, const std::string& dbname) const {
  PGconn* conn = PQconnectdb(conninfo_unix(dbname).c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = trim(PQerrorMessage(conn));
    PQfinish(conn);
    throw RuntimeError("pgtmp: connecting to " + dbname + ": " + msg);
  }
  PGresult* res = PQexec(conn, query.c_str());
  const ExecStatusType st = PQresultStatus(res);
  std::string out;
  if (st == PGRES_TUPLES_OK) {
    for (int r = 0; r < PQntuples(res); ++r) {
      if (r) out += '\n';
      if (PQnfields(res) > 0 && !PQgetisnull(res, r, 0)) out += PQgetvalue(res, r, 0);
    }
  } else if (st != PGRES_COMMAND_OK && st != PGRES_EMPTY_QUERY) {
    std::string msg = trim(PQresultErrorMessage(res));
    if (msg.empty()) msg = trim(PQerrorMessage(conn));
    PQclear(res);
    PQfinish(conn);
    throw RuntimeError("pgtmp: sql: " + msg);
  }
  PQclear(res);
  PQfinish(conn);
  return out;
}

std::vector<std::string> Server::client_env() const {
  return {"PGHOST=" + impl_->host, "PGPORT=" + std::to_string(impl_->port), "PGUSER=" + impl_->superuser,
          "PGDATABASE=postgres"};
}

int Server::run_tool(const std::string& tool, const std::vector<std::string>& args, std::string* out) const {
  detail::SpawnSpec spec;
  spec.argv.push_back(impl_->bindir + "/" + tool);
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = detail::environment({"PGHOST=", "PGPORT=", "PGUSER=", "PGDATABASE=", "PGHOSTADDR="}, client_env());
  return detail::run_capture(std::move(spec), out);
}

void Server::stop(bool immediate) {
  if (impl_->owner != getpid()) return;
  impl_->kill_postmaster(immediate, 30000);
}

void Server::start() {
  if (running()) return;
  impl_->start_postmaster();
}

void Server::restart(bool immediate) {
  stop(immediate);
  // Keep the port: clients and conninfo strings handed out stay valid.
  impl_->port_chosen = false;
  start();
}

bool Server::running() const {
  if (impl_->postmaster <= 0) return false;
  int st;
  if (detail::wait_for(impl_->postmaster, 0, &st)) {
    impl_->postmaster = 0;
    detail::set_postmaster(impl_->slot, 0);
    return false;
  }
  return true;
}

}  // namespace tierlab::pgtmp
