/**
 * Optional JSON Schema checks of requests, replies and deltas against the repository's
 * `schemas/` (draft 2020-12, through ajv).
 */

import * as fs from "node:fs";
import * as path from "node:path";
import Ajv2020 from "ajv/dist/2020";
import type { ValidateFunction } from "ajv";

export const REQUEST_SCHEMA = "agent-execute-request.schema.json";
export const REPLY_SCHEMA = "invoke-result.schema.json";
export const DELTA_SCHEMA = "reply-delta.schema.json";

/** A document does not match its schema; `errors` lists each problem with its path. */
export class SchemaError extends Error {
  override name = "SchemaError";
  constructor(
    what: string,
    readonly errors: string[],
  ) {
    super(`${what} does not match its schema: ${errors.join("; ")}`);
  }
}

/** `$APTIX_SCHEMAS_DIR`, else the first `schemas/` holding the reply schema above `start`. */
export function findSchemasDir(start: string = __dirname): string | null {
  if (process.env.APTIX_SCHEMAS_DIR) return process.env.APTIX_SCHEMAS_DIR;
  let dir = path.resolve(start);
  for (;;) {
    if (fs.existsSync(path.join(dir, "schemas", REPLY_SCHEMA))) return path.join(dir, "schemas");
    const up = path.dirname(dir);
    if (up === dir) return null;
    dir = up;
  }
}

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

/**
 * Validators for the request, reply and delta schemas of one directory. An absent schema file is
 * not checked (`has(name)` says which are loaded); the reply schema is required.
 */
export class Schemas {
  private readonly validators = new Map<string, ValidateFunction>();

  constructor(readonly directory: string) {
    const ajv = new Ajv2020({ allErrors: true, strict: false });
    ajv.addFormat("uuid", UUID);
    for (const f of ["uint64", "uint32", "int64", "int32", "uint", "uint8", "uint16"]) {
      ajv.addFormat(f, { type: "number", validate: (n: number) => Number.isInteger(n) });
    }
    for (const name of [REQUEST_SCHEMA, REPLY_SCHEMA, DELTA_SCHEMA]) {
      const file = path.join(directory, name);
      if (fs.existsSync(file)) {
        this.validators.set(name, ajv.compile(JSON.parse(fs.readFileSync(file, "utf8"))));
      }
    }
    if (!this.validators.has(REPLY_SCHEMA)) throw new Error(`no ${REPLY_SCHEMA} in ${directory}`);
  }

  has(name: string): boolean {
    return this.validators.has(name);
  }

  errors(name: string, doc: unknown): string[] {
    const v = this.validators.get(name);
    if (!v || v(doc)) return [];
    return (v.errors ?? []).map((e) => `${e.instancePath || "(root)"}: ${e.message ?? e.keyword}`);
  }

  check(name: string, doc: unknown, what: string): void {
    const errs = this.errors(name, doc);
    if (errs.length > 0) throw new SchemaError(what, errs);
  }

  checkRequest(body: unknown): void {
    this.check(REQUEST_SCHEMA, body, "request");
  }

  checkReply(body: unknown, messageId = "reply"): void {
    this.check(REPLY_SCHEMA, body, messageId);
  }

  checkDelta(body: unknown, messageId = "delta"): void {
    this.check(DELTA_SCHEMA, body, messageId);
  }
}
