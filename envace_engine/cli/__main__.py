from envace_engine.cli import main

main()
