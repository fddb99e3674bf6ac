/** knex's PostgreSQL dialect, which knex documents as a base class for custom clients; the parts we extend. */
declare module "knex/lib/dialects/postgres/index.js" {
  import type pg from "pg";
  import type { Knex } from "knex";
  class Client_PG {
    constructor(config: Knex.Config);
    connectionSettings: pg.ClientConfig;
    driver: typeof pg;
    logger: { warn(message: string): void };
    _acquireOnlyConnection(): Promise<pg.Client>;
    _query(connection: pg.Client, obj: unknown): Promise<unknown>;
    validateConnection(connection: pg.Client): boolean;
    acquireConnection(): Promise<unknown>;
    releaseConnection(connection: unknown): Promise<void>;
  }
  export default Client_PG;
}
