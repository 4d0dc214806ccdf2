// Validates Prometheus Operator objects (a JSON array on stdin: the
// rendered kustomization's ServiceMonitor and PrometheusRule) against the
// operator's CRD schemas, as the @kubernetes-models/prometheus-operator
// models carry them. Prints one line per problem; exits 1 if any.
import { readFileSync } from "node:fs";
import { PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const kinds = { PrometheusRule, ServiceMonitor };
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const o of objects) {
  const Model = kinds[o.kind];
  const name = `${o.kind}/${o.metadata?.name}`;
  if (!Model) {
    console.log(`${name}: no schema for this kind`);
    failed++;
    continue;
  }
  try {
    new Model(o).validate();
    console.log(`${name}: valid`);
  } catch (e) {
    console.log(`${name}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
