// Print the Zero replica's kb tables as JSON: {table: {columns: [...], rows: [...]}}.
// Usage: node read_replica.cjs REPLICA_FILE   (read-only; zero-cache keeps writing it)
const Database = require("@rocicorp/zero-sqlite3");
const db = new Database(process.argv[2], { readonly: true, fileMustExist: true });
const out = {};
const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").all();
for (const { name } of tables) {
  const columns = db.prepare(`SELECT name FROM pragma_table_info(?)`).all(name).map((c) => c.name);
  const rows = name.startsWith("kb.") ? db.prepare(`SELECT * FROM "${name}" ORDER BY id`).all() : [];
  out[name] = { columns, rows };
}
db.close();
process.stdout.write(JSON.stringify(out, (_, v) => (typeof v === "bigint" ? Number(v) : v)));
