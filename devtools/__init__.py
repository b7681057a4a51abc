"""Developer tooling that is not part of the installed package: freezing and
checking the SQL of each revision, and generating docs/ from the code."""
