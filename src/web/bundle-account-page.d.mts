/** Where the server looks for the built page. */
export const ACCOUNT_PAGE_DIR: string;
/** Builds the account page into `outDir` (ACCOUNT_PAGE_DIR by default); returns the names of the files written. */
export function bundleAccountPage(options?: { outDir?: string }): string[];
