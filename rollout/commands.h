// rollout/commands.h: the `bitroll` executable's subcommands. Each takes the arguments after the
// subcommand name (argv[0] is the subcommand) and returns the process exit status.
#pragma once

namespace bitroll::rollout {

// bitroll serve --model PATH --replicas N --bind tcp://127.0.0.1:PORT [--config F] [...]
int CmdServe(int argc, char** argv);
// bitroll replica --connect tcp://HOST:PORT --model PATH [--name S] [--config F]
int CmdReplica(int argc, char** argv);
// bitroll cost FILE.jsonl [--format table|csv|json] [--price-replica-hour USD] ...
int CmdCost(int argc, char** argv);
// bitroll update-weights --connect EP --version V (--path FILE | --stream FILE [--full]) ...
int CmdUpdateWeights(int argc, char** argv);
// bitroll self-test --model PATH [...]: the start-up invariance self-test alone (exit 0 / 1)
int CmdSelfTest(int argc, char** argv);
// bitroll generate ... (rollout/cmd_generate.cc, when built)
int CmdGenerate(int argc, char** argv);
// bitroll audit FILE.jsonl|--data-dir DIR --model M [--mode rescore|rerun] [--json];
// bitroll audit export --data-dir DIR (rollout/cmd_audit.cc)
int CmdAudit(int argc, char** argv);
// bitroll make-model ... (rollout/cmd_make_model.cc, when built)
int CmdMakeModel(int argc, char** argv);

}  // namespace bitroll::rollout
