/**
 * One field as RFC 4180 writes it: quoted when it holds a comma, semicolon
 * (some spreadsheets' separator), quote or line break, quotes doubled. Every
 * field a spreadsheet could read as a formula (=, +, -, @, tab or CR first)
 * is quoted with a leading apostrophe, as OWASP's CSV injection page says:
 * without exceptions, since "-1+1|cmd" starts like a number.
 */
export function csvField(value: string): string {
  const safe = /^[=+\-@\t\r]/.test(value) ? `'${value}` : value;
  return /[",;\r\n]/.test(safe) || safe !== value ? `"${safe.replaceAll('"', '""')}"` : safe;
}
