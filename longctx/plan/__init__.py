"""Stage plans: schema (TOML → pydantic), derived numbers, memory model and validation."""
