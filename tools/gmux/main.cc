// gmux: the command-line front end (simulator, and later status/lease/top/bench/demo).
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "admin.h"
#include "bench.h"
#include "demo_fairness.h"
#include "demo_memory.h"
#include "demo_pool.h"
#include "sim/output.h"
#include "demo_frames.h"
#include "lease.h"
#include "slurm.h"
#include "status.h"
#include "top.h"
#include "sim/scenario.h"

namespace {

struct SimRunArgs {
  std::string file;
  bool json = false;
  std::string csv_dir;
  std::string plot_dir;
};

int Fail(const std::string& message) {
  std::cerr << "gmux sim run: " << message << "\n";
  return 2;
}

int RunSim(const SimRunArgs& args) {
  auto out = gmux::sim::RunScenarioFile(args.file);
  if (!out.ok()) return Fail(out.status().message());
  if (!args.csv_dir.empty()) {
    auto files = gmux::sim::WriteCsv(args.csv_dir, out->series);
    if (!files.ok()) return Fail("--csv: " + files.status().message());
    std::cerr << "wrote " << files->size() << " CSV file(s) to " << args.csv_dir << "\n";
  }
  if (!args.plot_dir.empty()) {
    auto files = gmux::sim::WritePlots(args.plot_dir, out->series);
    if (!files.ok()) return Fail("--plot: " + files.status().message());
    std::cerr << "wrote " << files->size() << " chart(s) to " << args.plot_dir << "\n";
  }
  if (args.json) {
    std::cout << out->json.dump(2) << "\n";
  } else {
    std::cout << out->table;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gmux: fair, measurable GPU sharing among tenants"};
  app.require_subcommand(1);

  CLI::App* sim = app.add_subcommand("sim", "Discrete-event simulator for gmux's policies");
  sim->require_subcommand(1);
  CLI::App* sim_run = sim->add_subcommand(
      "run", "Run a scenario file and compare its policies (same seed: same output, byte for byte)");
  sim_run->footer(
      "Examples:\n"
      "  gmux sim run scenarios/vmcg-fairness.toml             table: fifo vs credit, λ per group\n"
      "  gmux sim run scenarios/kangyu-deviation.toml --json   one JSON object on stdout\n"
      "  gmux sim run scenarios/vmcg-fairness.toml --csv out/csv --plot out/png\n"
      "\n"
      "--csv writes one CSV per run (t_s, then one column per tenant: throughput per window);\n"
      "--plot also renders one PNG chart per run with gnuplot. The scenario format is described\n"
      "in docs/simulator.md. Exit status: 0 on success, 2 on any error (bad file, bad option,\n"
      "failed run), with the reason on stderr.");
  SimRunArgs args;
  sim_run->add_option("FILE", args.file, "Scenario file (TOML), e.g. scenarios/vmcg-fairness.toml")
      ->required();
  sim_run->add_flag("--json", args.json, "Print one JSON object instead of the table");
  sim_run->add_option("--csv", args.csv_dir,
                      "Write per-tenant throughput time series, one CSV per run, into DIR")
      ->type_name("DIR");
  sim_run->add_option("--plot", args.plot_dir,
                      "Render per-tenant throughput charts, one PNG per run, into DIR (gnuplot)")
      ->type_name("DIR");

  CLI::App* status = app.add_subcommand(
      "status", "Scheduler state of a running gmuxd: policies, per-tenant monitoring");
  std::string status_socket;
  bool status_json = false;
  status->add_option("--socket", status_socket,
                     "gmuxd's Unix socket (default: $GMUX_SOCKET, else /run/gmux/gmuxd.sock)");
  status->add_flag("--json", status_json, "Print the daemon's JSON instead of the table");
  status->footer(
      "Per tenant: Kang & Yu's monitored quantities (active tenants, total, processed and\n"
      "remaining work-items), commands, dispatches (chunks count one each), device time from\n"
      "profiling (START->END per dispatch) and, under `split`, the Eq. (1) usage.");
  gmux::cli::TopOptions top_opts;
  CLI::App* top = gmux::cli::AddTopSubcommand(app, top_opts);

  CLI::App* lease = app.add_subcommand(
      "lease", "Explicit leases on gmuxd's device pool (exclusive devices, BioCloud)");
  lease->require_subcommand(1);
  gmux::cli::LeaseOptions lease_opts;
  auto lease_common = [&lease_opts](CLI::App* c) {
    c->add_option("--socket", lease_opts.socket,
                  "gmuxd's Unix socket (default: $GMUX_SOCKET, else /run/gmux/gmuxd.sock)");
    c->add_flag("--json", lease_opts.json, "Print the daemon's JSON");
  };
  CLI::App* lease_acquire = lease->add_subcommand(
      "acquire", "Reserve a pool device (pinned: never reclaimed when idle)");
  lease_common(lease_acquire);
  lease_acquire->add_option("--tenant", lease_opts.tenant,
                            "For another tenant of the config (root and admin_uids only)");
  lease_acquire->add_option("--device", lease_opts.device,
                            "That pool device (its index in `gmux lease list`); it waits for "
                            "that one when it is taken")
      ->check(CLI::Range(0, 1023));
  lease_acquire->add_option("--for", lease_opts.for_text,
                            "Give it back after this long, e.g. 30m, 2h (default: until released)")
      ->type_name("DURATION");
  lease_acquire->add_option("--wait", lease_opts.wait_text,
                            "Wait this long for a free device, then withdraw the request and "
                            "exit 1 (default: return at once, the request stays queued)")
      ->type_name("DURATION");
  lease_acquire->footer(
      "Prints the lease id (L<n>) and the device. The tenant's programs use the leased device\n"
      "(their contexts on the pool device find it theirs) until `gmux lease release L<n>`.");
  CLI::App* lease_release = lease->add_subcommand("release", "Give a lease back (or withdraw a "
                                                              "waiting request)");
  lease_common(lease_release);
  lease_release->add_option("id", lease_opts.id, "The lease, e.g. L3")->required();
  CLI::App* lease_list = lease->add_subcommand(
      "list", "Pool devices, leases, waiting tenants, grant latency and reclaims");
  lease_common(lease_list);

  CLI::App* frames = app.add_subcommand(
      "frames", "Frame-rate SLAs of GL programs run with libgmux-frame.so (vGASA)");
  frames->require_subcommand(1);
  gmux::cli::FramesArgs frames_args;
  std::string frames_socket;
  bool frames_json = false;
  auto frames_common = [&](CLI::App* c) {
    c->add_option("--socket", frames_socket,
                  "gmuxd's Unix socket (default: $GMUX_SOCKET, else /run/gmux/gmuxd.sock)");
    c->add_flag("--json", frames_json, "Print the daemon's JSON");
  };
  CLI::App* frames_list = frames->add_subcommand(
      "list", "Frame agents: program, target, reference, measured FPS, sleep per frame, share");
  frames_common(frames_list);
  CLI::App* frames_policy = frames->add_subcommand(
      "policy", "Switch the SLA policy now (root and admin_uids): none, sa, fsa or esa");
  frames_common(frames_policy);
  frames_policy->add_option("policy", frames_args.policy, "none, sa, fsa or esa")
      ->required()
      ->check(CLI::IsMember({"none", "sa", "fsa", "esa"}));
  frames_policy->add_option("--device", frames_args.renderer,
                            "Only the GL renderers containing this text (default: all)");
  CLI::App* frames_target = frames->add_subcommand(
      "target", "Set a tenant's FPS target now (root and admin_uids); 0: the criterion");
  frames_common(frames_target);
  frames_target->add_option("tenant", frames_args.tenant, "The tenant")->required();
  frames_target->add_option("fps", frames_args.fps, "Frames per second")
      ->required()
      ->check(CLI::Range(0.0, 1000.0));
  frames->footer(
      "Programs opt in with LD_PRELOAD=libgmux-frame.so; their uid picks the tenant. The\n"
      "policy and targets start from the config's [frames] and fps_target (docs/operations.md,\n"
      "\"Frame-rate SLAs\"); changes made here last until gmuxd restarts.");

  CLI::App* usage = app.add_subcommand(
      "usage", "Usage booked in gmuxd's ledger: device time, commands, bytes, memory, leases");
  gmux::cli::UsageOptions usage_opts;
  usage->add_option("--socket", usage_opts.socket, "gmuxd's Unix socket (default: $GMUX_SOCKET)")
      ->type_name("PATH");
  usage->add_option("--ledger", usage_opts.ledger,
                    "Read this ledger file directly (no daemon needed; needs read access)")
      ->type_name("FILE");
  usage->add_option("--since", usage_opts.since,
                    "From: 2026-11-26, \"2026-11-26 13:00\", @UNIX, or back from now: 90m, 2h, 7d")
      ->type_name("TIME");
  usage->add_option("--until", usage_opts.until, "To (same forms); default: now")
      ->type_name("TIME");
  auto* usage_tenant = usage->add_option(
      "--tenant", usage_opts.tenant, "Only this tenant (a tenant always sees only its own)");
  uint64_t usage_job = 0;
  usage->add_option("--job", usage_job,
                    "Only this Slurm job's tenant (job-JOB, as the gmux prolog names it; "
                    "docs/cluster.md)")
      ->type_name("JOB")->check(CLI::PositiveNumber)->excludes(usage_tenant);
  usage->add_flag("--rows", usage_opts.rows,
                  "Every booked interval instead of sums per tenant and device");
  auto* usage_json = usage->add_flag("--json", usage_opts.json, "One JSON object");
  usage->add_flag("--csv", usage_opts.csv, "CSV with a header line")->excludes(usage_json);
  usage->footer(
      "gmuxd books each tenant's use of each device every [daemon] ledger_interval_s (10 s) into\n"
      "the SQLite file [daemon] ledger (docs/operations.md, \"Usage ledger\"). Intervals that\n"
      "overlap [since, until) count whole. memory is reserved device memory over time.");

  CLI::App* tenant = app.add_subcommand(
      "tenant", "Tenants of a running gmuxd: list, add, set, remove (operators change them)");
  tenant->require_subcommand(1);
  gmux::cli::TenantOptions tenant_opts;
  auto tenant_common = [&tenant_opts](CLI::App* c) {
    c->add_option("--socket", tenant_opts.socket, "gmuxd's Unix socket (default: $GMUX_SOCKET)")
        ->type_name("PATH");
    c->add_flag("--json", tenant_opts.json, "Print the daemon's JSON");
  };
  auto tenant_fields = [&tenant_opts](CLI::App* c) {
    c->add_option("name", tenant_opts.name, "The tenant's name")->required();
    c->add_option("--weight", tenant_opts.weight, "Its weight (share against the others)")
        ->check(CLI::PositiveNumber);
    c->add_option("--uid", tenant_opts.uids, "A local uid that is this tenant (repeatable; "
                  "replaces the list)")->check(CLI::NonNegativeNumber);
    c->add_option("--token", tenant_opts.tokens, "A TCP token that is this tenant (repeatable; "
                  "replaces the list)");
    c->add_option("--slurm-job", tenant_opts.slurm_job,
                  "A Slurm job whose processes are this tenant (0: none; docs/cluster.md)")
        ->check(CLI::NonNegativeNumber)->type_name("JOB");
    c->add_option("--fps-target", tenant_opts.fps_target,
                  "Frame agents' FPS target (0: [frames] criterion_fps)");
    c->add_option("--memory-quota", tenant_opts.memory_quota,
                  "Device memory per device, e.g. 4GiB (0: none)")->type_name("BYTES");
    c->add_option("--limit", tenant_opts.limits,
                  "Any [limits] key, e.g. --limit command_time_limit_s=30 (repeatable)")
        ->type_name("KEY=VALUE");
  };
  CLI::App* tenant_list = tenant->add_subcommand("list", "Every tenant (yours only, unless root "
                                                 "or an admin)");
  tenant_common(tenant_list);
  CLI::App* tenant_add = tenant->add_subcommand("add", "A new tenant; unset keys take [limits]");
  tenant_common(tenant_add);
  tenant_fields(tenant_add);
  CLI::App* tenant_set = tenant->add_subcommand("set", "Change the keys given; the rest stay");
  tenant_common(tenant_set);
  tenant_fields(tenant_set);
  CLI::App* tenant_remove = tenant->add_subcommand("remove", "Remove a tenant");
  tenant_common(tenant_remove);
  tenant_remove->add_option("name", tenant_opts.name, "The tenant's name")->required();
  tenant->footer(
      "Changes apply at once without dropping sessions: weights, limits, quotas and FPS targets\n"
      "of connected tenants change in place; uids and tokens pick the tenant of later\n"
      "connections; a removed tenant's sessions keep running. Only root and [daemon]\n"
      "admin_uids/admin_tokens may change tenants; invalid changes are refused whole.\n"
      "Tenants added here stay across SIGHUP (unless the file then names them); changes to\n"
      "the file's tenants last until the next reload. Not kept across a restart of gmuxd.");

  CLI::App* token = app.add_subcommand("token", "Tokens for TCP tenants, stored hashed");
  token->require_subcommand(1);
  bool token_json = false;
  CLI::App* token_hash = token->add_subcommand(
      "hash", "The token on stdin as the config stores it: sha256:<hex>");
  CLI::App* token_new = token->add_subcommand(
      "new", "A new random token, and its hashed form for the config");
  for (CLI::App* c : {token_hash, token_new}) c->add_flag("--json", token_json, "JSON output");
  token->footer(
      "A [[tenant]]'s tokens and [daemon] admin_tokens may be given as sha256:<hex> (what these\n"
      "print); clients still present the token itself (GMUX_TOKEN). gmuxd warns at start about\n"
      "tokens stored in plain text.");

  CLI::App* slurm = app.add_subcommand(
      "slurm", "What Slurm runs around each job so that the job is a tenant (docs/cluster.md)");
  slurm->require_subcommand(1);
  gmux::cli::SlurmOptions slurm_opts;
  for (const char* action : {"prolog", "epilog", "taskprolog", "taskepilog"}) {
    const std::string a = action;
    CLI::App* c = slurm->add_subcommand(
        action, a == "prolog"       ? "Register the job (SLURM_JOB_ID) as tenant job-JOB: weight = "
                                      "its shards"
                : a == "epilog"     ? "Remove the job's tenant (its usage stays in the ledger)"
                : a == "taskprolog" ? "Print the environment that sends the job's OpenCL "
                                      "programs to gmux"
                                    : "Have gmuxd write the job's usage into its AdminComment");
    c->add_option("--socket", slurm_opts.socket, "gmuxd's Unix socket (default: $GMUX_SOCKET)")
        ->type_name("PATH");
    c->add_option("--job", slurm_opts.job, "The job (default: $SLURM_JOB_ID)")->type_name("JOB");
    c->add_option("--node", slurm_opts.node,
                  "This node's Slurm name (default: $SLURMD_NODENAME, else the host name)");
    if (a == "prolog") {
      c->add_option("--fps-target", slurm_opts.fps_target, "The tenant's FPS target");
    }
    if (a == "epilog" || a == "taskepilog") {
      c->add_option("--wait", slurm_opts.wait_s,
                    "Seconds to wait for the job's sessions to end")->capture_default_str();
    }
    if (a == "taskprolog") {
      c->add_option("--icd-vendors", slurm_opts.icd_vendors,
                    "The directory holding gmux.icd (OCL_ICD_VENDORS for the job)")
          ->type_name("DIR");
    }
    c->callback([&slurm_opts, action] { slurm_opts.action = action; });
  }
  slurm->footer(
      "packaging/slurm/ has the Prolog, Epilog, TaskProlog and TaskEpilog scripts that call\n"
      "these, and the slurm.conf and gres.conf lines. gmuxd knows a job's processes by their\n"
      "cgroup.");

  CLI::App* demo = app.add_subcommand("demo", "Experiments on the real runtime");
  demo->require_subcommand(1);
  CLI::App* fair = demo->add_subcommand(
      "fairness", "fifo vs credit vs split on real OpenCL: Kang & Yu and VMCG setups");
  gmux::cli::DemoFairnessOptions fair_opts;
  fair->add_flag("--json", fair_opts.json, "One JSON object (the simulator's run fields)");
  fair->add_option("--window", fair_opts.window_s, "Measured seconds per run")
      ->capture_default_str()->check(CLI::PositiveNumber);
  fair->add_option("--warmup", fair_opts.warmup_s, "Seconds before the window")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  fair->add_option("--inflight", fair_opts.inflight, "gmuxd's commands in flight per device")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  fair->add_option("--depth", fair_opts.depth, "Launches each tenant keeps outstanding")
      ->capture_default_str()->check(CLI::Range(1, 64));
  fair->add_option("--policies", fair_opts.policies, "Comma-separated policies")
      ->capture_default_str();
  fair->add_option("--setups", fair_opts.setups,
                   "Comma-separated setups: kangyu, vmcg-equal, vmcg-weighted; closed loops: "
                   "closed-211, closed-equal, small-among-large, open-closed, unsplittable, restored, eight")
      ->capture_default_str();
  fair->add_option("--param", fair_opts.params,
                   "Policy parameter POLICY.KEY=VALUE, repeatable (e.g. split.beta=256, "
                   "credit.slice_max_ms=8); default split.beta=512")
      ->take_all();
  fair->footer(
      "Each run starts its own gmuxd on a temp socket; tenants are separate processes (own uids\n"
      "when run as root). Shares are each tenant's device time in the measured window, from the\n"
      "daemon's profiling; throughput is work-items completed per second. Takes ~1 min.\n"
      "Closed-loop setups run every tenant alone first; their shares are work rates against\n"
      "alone, with the total work against fifo's when fifo runs first (docs/operations.md).\n");

  CLI::App* mem = demo->add_subcommand(
      "memory", "DymGPU slots on real OpenCL: oversubscribed device memory, baseline vs size vs "
                "utilization");
  gmux::cli::DemoMemoryOptions mem_opts;
  mem->add_flag("--json", mem_opts.json, "One JSON object with every run");
  mem->add_option("--policies", mem_opts.policies, "Comma-separated slot placement policies")
      ->capture_default_str();
  mem->add_option("--swap-batch", mem_opts.swap_batch,
                  "Comma-separated [daemon] swap_batch values; every policy runs with each "
                  "(0: no batching)")
      ->capture_default_str();
  mem->add_option("--capacity", mem_opts.capacity, "Managed device memory ([daemon] memory_bytes)")
      ->capture_default_str();
  mem->add_option("--slot", mem_opts.slot, "Slot size ([daemon] slot_bytes)")->capture_default_str();
  mem->add_option("--tenants", mem_opts.tenants, "Tenant processes")
      ->capture_default_str()->check(CLI::Range(1, 16));
  mem->add_option("--mib", mem_opts.mib, "Each tenant's buffer in MiB")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  mem->add_option("--rounds", mem_opts.rounds, "Rounds per tenant (launches, clFinish, check)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  mem->add_option("--timeout", mem_opts.timeout_s,
                  "Seconds per run; tenants still running then are killed and the run reports "
                  "an error with the daemon's status and log")
      ->capture_default_str()->check(CLI::Range(1.0, 86400.0));
  mem->footer(
      "Each policy and swap_batch gets its own gmuxd with memory_slots set; tenants are separate processes (own\n"
      "uids when run as root). Tenant i bumps every word of its buffer max(1, 4-i) times per round\n"
      "(one launch + clFinish each), reads it all back and checks it, then thinks 25*i ms. The\n"
      "default (4 x 400 MiB on 1 GiB) needs ~8 GiB of host memory and takes a few minutes.\n"
      "Exit 1 when any result differed from the CPU's or a tenant failed.");

  CLI::App* pool = demo->add_subcommand(
      "pool", "BioCloud's device pool on real OpenCL: static assignment vs leases, 1/2/4 devices");
  CLI::App* frames_demo = demo->add_subcommand(
      "frames", "vGASA's SLA policies on real GL programs (Xvfb, llvmpipe): none, sa, fsa, esa");
  gmux::cli::DemoFramesOptions frames_opts;
  frames_demo->add_flag("--json", frames_opts.json, "One JSON object with every phase");
  frames_demo->add_option("--plot", frames_opts.plot_dir,
                          "Write per-second FPS series (CSV) and plots (PNG, gnuplot) here");
  frames_demo->add_option("--policies", frames_opts.policies, "Comma-separated SLA policies")
      ->capture_default_str();
  frames_demo->add_option("--seconds", frames_opts.seconds, "Seconds per policy")
      ->capture_default_str()
      ->check(CLI::Range(3.0, 3600.0));
  frames_demo->add_option("--settle", frames_opts.settle_s,
                          "Seconds at the start of each policy not counted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600.0));
  frames_demo->add_option("--criterion", frames_opts.criterion_fps, "The SLA criterion (FPS)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 500.0));
  frames_demo->add_option("--target-usage", frames_opts.target_usage,
                          "ESA's planned share of the device (here: the CPUs llvmpipe draws on)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 1.0));
  frames_demo->add_flag("!--no-step", frames_opts.step, "Skip the PI step-response phase");
  frames_demo->add_flag("!--no-overhead", frames_opts.overhead, "Skip the agent-overhead phase");
  frames_demo->add_option("--overhead-pairs", frames_opts.overhead_pairs,
                          "Runs without and with the agent in the overhead phase, alternated")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  frames_demo->footer(
      "Three unmodified GL programs of different cost (glxgears; gl_frames, medium, through\n"
      "EGL; gl_frames, heavy) run at once with libgmux-frame.so under one gmuxd, one phase per\n"
      "policy. Reports mean FPS once settled, frames over 34/60 ms, device usage, the goals of\n"
      "docs/reproductions.md, a PI step response and the agent's overhead. Needs Xvfb.");

  gmux::cli::DemoPoolOptions pool_opts;
  pool->add_flag("--json", pool_opts.json, "One JSON object with every configuration");
  pool->add_option("--devices", pool_opts.devices, "Comma-separated pool sizes")
      ->capture_default_str();
  pool->add_option("--sleeps", pool_opts.sleeps,
                   "Comma-separated sleeps between runs, in jobs (BioCloud: 9/18 and 36/18)")
      ->capture_default_str();
  pool->add_option("--modes", pool_opts.modes,
                   "Comma-separated: static (a device per tenant for its whole run), pool (a "
                   "lease per run), reclaim (one program, the checker reclaims in the sleeps)")
      ->capture_default_str();
  pool->add_option("--tenants", pool_opts.tenants, "Tenant processes")
      ->capture_default_str()->check(CLI::Range(1, 16));
  pool->add_option("--runs", pool_opts.runs, "Runs per tenant")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  pool->add_option("--job", pool_opts.job_s, "Seconds of device work per run")
      ->capture_default_str()->check(CLI::Range(0.01, 600.0));
  pool->add_option("--timeout", pool_opts.timeout_s, "Seconds per configuration")
      ->capture_default_str()->check(CLI::Range(1.0, 86400.0));
  pool->footer(
      "Each configuration gets its own gmuxd whose PoCL devices (POCL_DEVICES, one thread each)\n"
      "are exclusive but device 0. static: each tenant's program keeps its context (its lease)\n"
      "from its first run to its last; pool: each run is a program of its own (context, build,\n"
      "job, release); reclaim: one program, the pool's checker reclaims in the sleeps.\n"
      "Completion times are normalised to BioCloud's theoretical time; the simulator's figures\n"
      "for the same workload are beside them. Exit 1 when a run failed or a result was wrong.");

  CLI::App* bench = app.add_subcommand(
      "bench", "Plain OpenCL programs natively and through gmux in one run, with the ratios");
  gmux::cli::BenchOptions bench_opts;
  bench->add_option("--socket", bench_opts.socket,
                    "A running gmuxd's Unix socket (default: $GMUX_SOCKET; with neither, this "
                    "build's gmuxd is started on a socket of its own for the run)")
      ->type_name("PATH");
  bench->add_option("--address", bench_opts.address,
                    "A running gmuxd over TCP instead: HOST:PORT is TLS (GMUX_TLS_CA and "
                    "GMUX_TOKEN from the environment), tcp://HOST:PORT plain TCP")
      ->type_name("ADDRESS");
  bench->add_option("--native", bench_opts.native,
                    "The native platform: a part of its name (default: the first that is not gmux)");
  bench->add_option("--sizes", bench_opts.sizes, "Transfer sizes, e.g. 4K,1M,256M")
      ->delimiter(',')->capture_default_str();
  bench->add_option("--repeat", bench_opts.repeat,
                    "Runs of each workload per platform, alternating them; the median is shown")
      ->capture_default_str()->check(CLI::Range(1, 100));
  bench->add_option("--clients", bench_opts.clients,
                    "Processes in the many-clients run, each a closed loop of launch + clFinish "
                    "for 2 s (0: skip it; --quick: at most 2, for 0.3 s)")
      ->capture_default_str()->check(CLI::Range(0, 256));
  bench->add_flag("--quick", bench_opts.quick,
                  "Few iterations and transfers up to 1 MiB: checks a host, measures nothing");
  bench->add_flag("--json", bench_opts.json, "One JSON object instead of the table");
  bench->footer(
      "Workloads, each written as an ordinary program writes it (blocking calls, std::vector):\n"
      "a 1-work-item launch + clFinish (p50, p99), the same timed by its event (a wait or a\n"
      "clFinish, then its start and end from clGetEventProfilingInfo), clFinish of an idle\n"
      "queue, the status of a command that waits on a user event (what a blocking call costs\n"
      "through gmux with no device work), 20,000 launches then one clFinish, blocking\n"
      "writes and reads of each size (GB/s; each call's p50 and p99 in --json, p99 shown), a\n"
      "512x512 matrix multiply end to end, a work-group size query (clGetKernelWorkGroupInfo,\n"
      "as before each launch), and --clients processes at once, each a closed loop of\n"
      "launch + clFinish (launches/s of them all; the median of their p50s); every result is\n"
      "checked. Also a 64-byte Unix socket round trip between two processes, the unit of the\n"
      "latency goal, and with --address plain TCP socket copies on loopback, the bounds for\n"
      "transfers over TCP: per size, the same bytes as the bench's writes and reads, from one\n"
      "std::vector into a new one (rows 'TCP: socket copy'), and the socket's peak, one cached\n"
      "4 MiB chunk sent again and again. Exit 1 when a result is wrong or a call fails. Takes\n"
      "about a minute.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (sim_run->parsed()) return RunSim(args);
  if (status->parsed()) return gmux::cli::RunStatus(status_socket, status_json);
  if (top->parsed()) return gmux::cli::RunTop(top_opts);
  if (usage->parsed()) {
    if (usage_job != 0) usage_opts.tenant = "job-" + std::to_string(usage_job);
    return gmux::cli::RunUsage(usage_opts);
  }
  if (tenant->parsed()) {
    const char* action = tenant_list->parsed()  ? "list"
                         : tenant_add->parsed() ? "add"
                         : tenant_set->parsed() ? "set"
                                                : "remove";
    return gmux::cli::RunTenant(action, tenant_opts);
  }
  if (slurm->parsed()) return gmux::cli::RunSlurm(slurm_opts);
  if (token_hash->parsed()) return gmux::cli::RunTokenHash(token_json);
  if (token_new->parsed()) return gmux::cli::RunTokenNew(token_json);
  if (lease_acquire->parsed()) return gmux::cli::RunLeaseAcquire(lease_opts);
  if (lease_release->parsed()) return gmux::cli::RunLeaseRelease(lease_opts);
  if (lease_list->parsed()) return gmux::cli::RunLeaseList(lease_opts);
  if (frames->parsed()) {
    frames_args.action = frames_list->parsed() ? "list" : frames_policy->parsed() ? "policy"
                                                                                  : "target";
    return gmux::cli::RunFrames(frames_socket, frames_args, frames_json);
  }
  if (fair->parsed()) return gmux::cli::RunDemoFairness(fair_opts);
  if (mem->parsed()) return gmux::cli::RunDemoMemory(mem_opts);
  if (pool->parsed()) return gmux::cli::RunDemoPool(pool_opts);
  if (frames_demo->parsed()) return gmux::cli::RunDemoFrames(frames_opts);
  if (bench->parsed()) return gmux::cli::RunBench(bench_opts);
  return 0;
}
