"""The launcher's config node, registered as ``hydra/launcher=population`` (as hydra-joblib-launcher
registers ``joblib``): Hydra imports every module under the ``hydra_plugins`` namespace package."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class PopulationLauncherConf:
    _target_: str = "hydra_plugins.prorl_bench_population.population_launcher.PopulationLauncher"
    size: int = 16  # most members per population (jobs that differ only in seed)
    n_jobs: int = 2  # worker processes (at most the CPUs available), each given at most ceil(jobs / workers) jobs
    dry_run: bool = False  # print which jobs batch into which population, and why the others cannot; run nothing


ConfigStore.instance().store(group="hydra/launcher", name="population", node=PopulationLauncherConf)
