// Runs a worker thread's TypeScript module from the sources (tests and tsx
// scripts): a worker does not inherit the loader its parent runs under, so it
// registers tsx's own, then imports the module. Compiled code never uses it.
import { workerData } from "node:worker_threads";
import { register } from "tsx/esm/api";

register();
await import(workerData.typescriptModule);
