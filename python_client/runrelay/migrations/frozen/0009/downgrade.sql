-- Undo revision 0009's table changes. Each change has its own section,
-- delimited by a header and an end line, so that sections written
-- separately merge side by side.

-- ==== operators' listings ==================================================
DROP INDEX runs_key_list_idx;
DROP INDEX runs_list_idx;
-- ==== end: operators' listings =============================================
