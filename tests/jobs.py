"""Job configs the multi-process tests and benches start heads with: tiny-arith on the
arithmetic task, small groups, and whatever a test changes (as TOML lines).

The agent is agents/arithmetic_http.py's unless a job names another: the quickstart's agent
over plain HTTP, because these tests are about the swarm, not the agent's client, and the
``openai`` SDK's ~2 ms of CPU a call is most of a runner's work (a run that trains a fixed
number of steps pays it on every episode).  The SDK path has its own tests (the quickstart,
the frameworks, the transport) and the jobs that name agents.arithmetic."""


def tiny_arith(steps: int, group_size: int = 4, groups_per_step: int = 4, runner_concurrency: int = 8,
               eval_every: int = 1000, model: str = "", train: str = "",
               behavior: str = "actorjet_agents.arithmetic_http:behavior") -> str:
    """``model`` / ``train``: extra lines for [[models]] / [train] (e.g. ``"stall_s = 4.0"``)."""
    return (f'[[models]]\nname = "policy"\nsource = "tiny-arith"\neval_every = {eval_every}\n{model}\n'
            f'[[tasks]]\nname = "arithmetic"\nsource = "agents.arithmetic"\nbehavior = "{behavior}"\n'
            f"[train]\ngroup_size = {group_size}\ngroups_per_step = {groups_per_step}\nsteps = {steps}\n"
            f"runner_concurrency = {runner_concurrency}\n{train}\n")
