"""The Ray backend (`env_backend: ray`): the driver's batch (`driver.RayBatchEnv`), the
actors that host groups of environments (`actor`) and the connection to Ray
(`connection`). Importing this package does not import Ray."""
