// Print schema.ts as {serverName: [server column names]} (for tests/test_zero.py).
import { schema } from "./schema.ts";

const out: Record<string, string[]> = {};
for (const t of Object.values(schema.tables) as any[]) {
  out[t.serverName ?? t.name] = Object.entries(t.columns).map(([name, c]: [string, any]) => c.serverName ?? name);
}
process.stdout.write(JSON.stringify(out));
