import type { DescMethodUnary, DescService } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { requireApiKey } from "../call/authentication.js";
import { httpBindingOf, jsonTouchesOf } from "../http/http-bindings.js";
import type { RouteDoor, RpcRoute } from "./gateway.js";

/** A service and its implementation, as registered on the Connect router, and the door of its JSON paths. */
export interface ServedService<S extends DescService = DescService> {
  service: S;
  impl: ServiceImpl<S>;
  /** Who may call its JSON paths; the API key when not given. */
  door?: RouteDoor;
}

/** A service for the path table; without a door of its own, its paths need an API key. */
export function served<S extends DescService>(service: S, impl: ServiceImpl<S>, door?: RouteDoor): ServedService {
  return { service, impl, door } as unknown as ServedService;
}

/** The API's door: a well-formed `Authorization: Bearer` key (the service checks that it is live). */
export const apiKeyDoor: RouteDoor = (ctx) => {
  requireApiKey(ctx);
};

/**
 * The JSON path table, built from the `google.api.http` annotations in
 * proto/: every annotated unary RPC of a served service gets its path, so the
 * proto is the source of truth for the HTTP surface as for the messages.
 */
export function apiRoutes(services: ServedService[]): RpcRoute[] {
  const routes: RpcRoute[] = [];
  for (const { service, impl, door = apiKeyDoor } of services) {
    for (const method of service.methods) {
      const binding = httpBindingOf(method);
      if (binding === undefined) continue;
      const handler = (impl as Record<string, RpcRoute["impl"] | undefined>)[method.localName];
      if (method.methodKind !== "unary") throw new Error(`${method.parent.typeName}.${method.name}: an HTTP binding needs a unary RPC`);
      if (handler === undefined) throw new Error(`${method.parent.typeName}.${method.name}: has an HTTP binding but no implementation`);
      const touches = jsonTouchesOf(method);
      routes.push({ ...binding, method: method as DescMethodUnary, impl: handler.bind(impl), door, reshapeAnswerJson: touches?.reshapeAnswerJson });
    }
  }
  return routes;
}
