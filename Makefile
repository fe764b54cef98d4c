# Thin aliases for the two commands in README.md.
.PHONY: run test
run:
	./scripts/serve
test:
	./scripts/test
