import { unitsToCredits } from "../units.js";
import type { Funding } from "./ledger.js";

/** The billing block of a response. Credits are exact decimal views of integer units. */
export interface Billing {
  funding: Funding;
  reservedCredits: number;
  chargedCredits: number;
  /** Balance right after this call's own settle (not after later calls), also when a retry recognised the settle. */
  balanceCredits: number;
  /** Balance minus the holds of calls still in flight. */
  availableCredits: number;
  /** Free requests not used and not held. */
  freeRequestsRemaining: number;
  requestId: string;
}

/** The billing block of one call from its hold and the account figures its settle reported (recorded on its entry, for a replay). */
export function billingOf(
  requestId: string,
  funding: Funding,
  reservedUnits: number,
  chargedUnits: number,
  account: { balanceUnits: number; availableUnits: number; freeAvailable: number },
): Billing {
  return {
    funding,
    reservedCredits: unitsToCredits(reservedUnits),
    chargedCredits: unitsToCredits(chargedUnits),
    balanceCredits: unitsToCredits(account.balanceUnits),
    availableCredits: unitsToCredits(account.availableUnits),
    freeRequestsRemaining: account.freeAvailable,
    requestId,
  };
}
