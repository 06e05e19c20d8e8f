# METADATA
# title: Classes and GPU-time quotas by user and team
# description: |
#   data.yaml maps users to teams and teams to a class and a GPU-time quota.
#   A team's best-effort jobs may use at most their max_gpu_share of a GPU;
#   users in no team get the default quota.
package arbiter

import data.arbiter.lib

default_decision := object.union(
	lib.with_reason(lib.classes["best-effort"], "user in no team"),
	{"quota": {"max_gpu_share": data.default_max_gpu_share}},
)

classify := object.union(lib.with_reason(lib.classes[t.class], sprintf("user %s in team %s", [input.process.user, name])), quota(t)) if {
	name := team_of(input.process)
	t := data.teams[name]
} else := default_decision

# team_of finds the team by user name, else by uid.
team_of(p) := data.users[p.user] if {
	p.user != ""
} else := data.uids[sprintf("%d", [p.uid])]

quota(t) := {"quota": {"max_gpu_share": t.max_gpu_share}} if t.max_gpu_share

else := {}

# Quotas travel with each decision; the engine duty-cycles a process that
# goes over its max_gpu_share. The control loop is the default one.
victims := lib.default_victims
