from vlm_decade.cli import main

main()
